"""A check, before chain verification, that the model scores several new tokens after a cache
as it scores them one at a time.

Chain mode exists for models that cannot take a tree mask (position biases, no position ids,
unusual caches), so it meets the least ordinary forwards; some cannot extend a cache by more
than one token at all (CPM-Ant rebuilds its positions from the new ids alone). Before the first
chain, ``probe_chain_forward`` runs a short random prompt, then the same ``PROBE_STEPS`` tokens
once as one chain and once token by token, and compares the logits: a crash or a mismatch
becomes one typed ``UnsupportedModelError`` before the user's prompt is touched. Cost: two
forwards over ``PROBE_PROMPT`` tokens and ``PROBE_STEPS + 1`` tiny ones, once per ``TreeModel``.
"""

from __future__ import annotations

import torch

from retrieval_draft.errors import UnsupportedModelError
from retrieval_draft.model.attention_layout import AttentionLayout

PROBE_PROMPT = 6  # tokens of random prompt
PROBE_STEPS = 3  # new tokens scored both ways
_TOLERANCE = 1e-3  # of the largest logit's size, far above float32 rounding, far below a wrong mask's effect


@torch.no_grad()
def probe_chain_forward(model: torch.nn.Module, new_cache, layout: AttentionLayout) -> None:
    """Raise ``UnsupportedModelError`` unless a ``PROBE_STEPS``-token forward after a cache gives the
    logits of as many one-token forwards. ``new_cache()`` makes an empty cache; ``layout``: the
    model's ``AttentionLayout`` (whether it takes ``position_ids``, its cache keyword)."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(3, max(vocab, 4), (1, PROBE_PROMPT + PROBE_STEPS), generator=generator).to(device)
    name = type(model).__name__
    try:
        together = _score(model, new_cache(), ids, [PROBE_STEPS], layout)
        apart = _score(model, new_cache(), ids, [1] * PROBE_STEPS, layout)
    except (RuntimeError, ValueError, IndexError, TypeError) as error:
        raise UnsupportedModelError(
            f"{name} cannot score several new tokens after a cache ({type(error).__name__}), so drafts cannot be verified"
        ) from error
    scale = float(apart.abs().max()) or 1.0
    if float((together - apart).abs().max()) > _TOLERANCE * scale:
        raise UnsupportedModelError(
            f"{name} scores several new tokens after a cache differently from one at a time, so drafts cannot be verified"
        )


def _score(model, cache, ids: torch.Tensor, pieces: list[int], layout: AttentionLayout) -> torch.Tensor:
    """Logits (PROBE_STEPS, V) of the last ``sum(pieces)`` ids, fed after the prompt in ``pieces``."""
    start = ids.shape[1] - sum(pieces)
    _forward(model, cache, ids, 0, start, layout)
    rows = []
    for size in pieces:
        rows.append(_forward(model, cache, ids, start, start + size, layout))
        start += size
    return torch.cat(rows).float()


def _forward(model, cache, ids: torch.Tensor, begin: int, end: int, layout: AttentionLayout) -> torch.Tensor:
    positions = torch.arange(begin, end, device=ids.device)[None]
    out = model(input_ids=ids[:, begin:end], **layout.cache_kwargs(cache), use_cache=True,
                **layout.position_kwargs(positions))
    return out.logits[0]
