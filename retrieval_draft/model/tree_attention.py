"""SDPA for tree forwards without copying the KV cache once per query head.

With an explicit mask, HF's SDPA integration expands grouped-query keys and
values to every query head (``repeat_kv``) on CPU and CUDA: for SmolLM2-135M
(9 query heads, 3 KV heads) that copies the whole cache three times over in
every layer of every tree forward: on a 2-core CPU, 3 ms of a 62 ms forward
over 8 tokens after a 256-token prompt, 7.5 ms of 79 ms after 1,500 tokens
(``tools/diagnostics/forward_cost.py``). Plain decoding passes no mask and takes SDPA's
own GQA path, so only tree verification paid this.

``grouped_sdpa`` computes the same attention with the query heads that share
a KV head stacked along the query axis: queries (B, H, n, d) become
(B, H_kv, G*n, d) with G = H / H_kv, the (B or 1, 1, n, k) mask is tiled G times
along its rows, and the cache is read as it is. ``tree_attention(configs)``
routes a model's SDPA layers through it for the duration of one forward;
``sdpa_configs(model)`` finds the configs to switch.

Every layer of one forward gets the same mask object, so the tiled mask is made
once per forward (``_FORWARD_TILES``, a memo that exists only inside
``tree_attention``'s block): on a GPU each tiling is a kernel launch, 30 per
SmolLM2 forward (timed on the launch-bound H100 VM of 2026-11-26, the difference
was within that machine's noise; docs/host-time.md).

On CUDA a forward with a mask may also take cuDNN's attention kernel, which builds
an execution plan for every new pair of query and key lengths; in decoding the key
length grows by a step's accepted tokens every step, so every tree forward would
pay a build (scratch timings on the lent H200, 2026-11-28, torch 2.11: one masked
SDPA call of SmolLM2's attention shape took 64 ms, median, while the key length grew
by one a call, 0.06 ms at a fixed length, 0.16 ms growing with cuDNN off).
``steady_attention(device)`` keeps a masked forward off that kernel (SDPA then takes
the memory-efficient one, or the math one where the user allows only that); on
other devices it changes nothing.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from contextvars import ContextVar

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

GROUPED_SDPA = "retrieval_draft_grouped_sdpa"
# (id of a mask, G) -> (that mask, it tiled G times), for the forward inside ``tree_attention``'s
# block; None outside it. Keeping the mask itself keeps its id from being reused meanwhile.
_FORWARD_TILES: ContextVar[dict | None] = ContextVar("retrieval_draft_forward_tiles", default=None)


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention for one layer; same contract as HF's ``sdpa_attention_forward``.

    Args:
        query: (B, H, n, d) new tokens' queries.
        key, value: (B, H_kv, k, d) the cache plus the new tokens, k = past + n.
        attention_mask: (B or 1, 1, n, k) additive float mask shared by all heads.

    Returns:
        ((B, n, H, d) attention output, None). Calls that are not this case
        (no mask, a per-head mask, softcapping, position biases, query heads
        not a multiple of KV heads) go to HF's own SDPA function unchanged.
    """
    # Groups from the shapes, not the module: some attentions (DeepSeek's MLA) expand their KV
    # heads themselves, where HF's function would repeat them once more.
    groups = query.shape[1] // key.shape[1]
    plain = (
        groups * key.shape[1] != query.shape[1]
        or attention_mask is None
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or attention_mask.shape[0] not in (1, query.shape[0])
        or kwargs.get("softcap") is not None
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
    )
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    batch, heads, n, dim = query.shape
    kv_heads = key.shape[1]
    stacked = query.reshape(batch, kv_heads, groups * n, dim)
    mask = tiled(attention_mask, groups)
    out = torch.nn.functional.scaled_dot_product_attention(
        stacked, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(batch, heads, n, value.shape[-1]).transpose(1, 2).contiguous(), None


def tiled(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``mask`` (R, 1, n, k) repeated ``groups`` times along its rows: (R, 1, G*n, k); made once
    per forward inside ``tree_attention``'s block."""
    tiles = _FORWARD_TILES.get()
    made = tiles.get((id(mask), groups)) if tiles is not None else None
    if made is not None and made[0] is mask:
        return made[1]
    rows, _, n, keys = mask.shape
    out = mask.expand(rows, groups, n, keys).reshape(rows, 1, groups * n, keys)
    if tiles is not None:
        tiles[(id(mask), groups)] = (mask, out)
    return out


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)


def sdpa_configs(model: torch.nn.Module) -> list:
    """The distinct config objects of ``model``'s modules that select SDPA attention."""
    found = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == "sdpa":
            found[id(config)] = config
    return list(found.values())


@contextmanager
def tree_attention(configs: list):
    """Within the block, layers reading ``configs`` (from ``sdpa_configs``) use ``grouped_sdpa``."""
    switched = [c for c in configs if c._attn_implementation == "sdpa"]
    for config in switched:
        config._attn_implementation = GROUPED_SDPA
    memo = _FORWARD_TILES.set({})
    try:
        yield
    finally:
        _FORWARD_TILES.reset(memo)
        for config in switched:
            config._attn_implementation = "sdpa"


def steady_attention(device: torch.device):
    """A context for one masked forward on ``device``: on CUDA, SDPA may not take cuDNN's kernel
    while a kernel that takes a mask without a per-shape build (memory-efficient or math) is
    enabled; elsewhere, and when cuDNN is off already, nothing changes."""
    if torch.device(device).type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return nullcontext()
    if not (torch.backends.cuda.mem_efficient_sdp_enabled() or torch.backends.cuda.math_sdp_enabled()):
        return nullcontext()
    return _cudnn_attention_off()


@contextmanager
def _cudnn_attention_off():
    """Within the block SDPA's cuDNN kernel is disabled (a process-wide flag, restored on exit: a
    forward in another thread meanwhile takes another kernel too, which changes no result beyond a
    reduced precision's rounding)."""
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
