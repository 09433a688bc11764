"""Config keyword arguments that shrink any causal-LM config to a tiny model with a small window.

Config classes name the same size differently (``hidden_size``, ``n_embd``,
``d_model``; ``num_hidden_layers``, ``n_layer``, ``num_layers``, ...).
``TINY_SIZES`` maps every spelling found in transformers 5.23's causal-LM
configs to one tiny value; ``model_sizes`` keeps the names a config declares,
never raising a smaller declared default and keeping equalities the class
declares (``EQUAL_PAIRS``). Sub-configs are shrunk the same way (``tiny_kwargs``).
Per-layer lists (``layer_types``, ``mlp_layer_types``, ...) are cut to the
tiny depth keeping every kind they hold (``shrink_layer_lists``);
``apply_window`` makes sliding windows and attention chunks small and on.
"""

from __future__ import annotations

import dataclasses

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, POSITIONS = 64, 4, 2, 16, 128, 300, 512
EXPERT_FFN = 32

TINY_SIZES = {
    # width
    "hidden_size": HIDDEN, "n_embd": HIDDEN, "d_model": HIDDEN, "dim": HIDDEN, "embedding_size": HIDDEN,
    # attention heads
    "num_attention_heads": HEADS, "n_head": HEADS, "num_heads": HEADS, "n_heads": HEADS,
    "decoder_attention_heads": HEADS, "swa_num_attention_heads": HEADS, "num_attention_heads_per_layer": HEADS,
    "num_key_value_heads": KV_HEADS, "num_kv_heads": KV_HEADS, "n_kv_heads": KV_HEADS,
    "swa_num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM, "kv_channels": HEAD_DIM, "swa_head_dim": HEAD_DIM, "dim_head": HEAD_DIM, "rotary_dim": 8,
    # feed-forward
    "intermediate_size": FFN, "n_inner": FFN, "ffn_dim": FFN, "decoder_ffn_dim": FFN, "ffn_hidden_size": FFN,
    "intermediate_size_mlp": FFN, "prefix_dense_intermediate_size": FFN, "dim_ff": FFN, "dff": FFN,
    "moe_intermediate_size": EXPERT_FFN, "shared_expert_intermediate_size": EXPERT_FFN,
    "shared_intermediate_size": EXPERT_FFN, "expert_ffn_hidden_size": EXPERT_FFN,
    "shared_experts_intermediate_size": EXPERT_FFN,
    # vocabulary and positions
    "vocab_size": VOCAB, "unpadded_vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": HEAD_DIM,
    "max_position_embeddings": POSITIONS, "n_positions": POSITIONS, "n_ctx": POSITIONS, "max_seq_len": POSITIONS,
    "original_max_position_embeddings": POSITIONS,
    # mixture of experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_topk": 2, "top_k_experts": 2, "moe_k": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "num_dense_layers": 1, "zero_expert_num": 2,
    # hybrids that place attention (or experts) every ``period`` layers from ``offset``
    "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
    # multi-head latent attention and sparse-attention indexers
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": HEAD_DIM,
    "qk_head_dim": HEAD_DIM, "index_head_dim": HEAD_DIM, "index_n_heads": 2, "o_lora_rank": 16, "o_groups": 2,
    # state-space and linear-attention layers
    # (expand 1, so heads x head size = HIDDEN)
    "expand": 1, "mamba_expand": 1, "mamba_d_state": 8, "ssm_state_size": 8, "state_size": 8,
    "mamba_n_heads": HEADS, "mamba_num_heads": HEADS, "mamba_d_head": HEAD_DIM, "mamba_head_dim": HEAD_DIM,
    "mamba_d_ssm": HIDDEN, "mamba_n_groups": 1, "n_groups": 1, "mamba_dt_rank": 8, "time_step_rank": 8,
    "n_mamba_heads": 2, "moe_shared_expert_intermediate_size": EXPERT_FFN,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": HEAD_DIM,
    "linear_value_head_dim": HEAD_DIM, "linear_head_dim": HEAD_DIM, "linear_num_heads": HEADS,
    # byte-level patching (BLT)
    "encoder_hash_byte_group_vocab": VOCAB,
}

# Depth fields; their value is the tiny depth of ``tiny_depth``.
DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")

# Counts of layers that must stay a fraction of the depth (Gemma 3n shares KV over its last layers).
HALF_DEPTH_FIELDS = ("num_kv_shared_layers",)

# Fields set even where their default is None (None there means "derive from other sizes",
# or, for the expert counts, a default config that cannot be built).
SET_WHEN_NONE = ("head_dim", "num_key_value_heads", "n_routed_experts", "num_experts_per_tok", "n_shared_experts")

WINDOW_FIELDS = (
    "sliding_window", "sliding_window_size", "local_attention_window_len", "window_size", "attention_window_size",
    "keep_window_size",  # Doge: keys beyond it are picked per query by a learnt top-k
    "attention_chunk_size",
)

# (field, other): where a class declares equal defaults for both, the tiny ``field`` copies the tiny ``other``
# (some configs require the equality: multi-head attention, a rotary head that is the whole head).
EQUAL_PAIRS = (("num_key_value_heads", "num_attention_heads"), ("head_dim", "qk_rope_head_dim"))

_UNREADABLE = object()


def _declared(config_cls) -> set[str]:
    """The dataclass field names of ``config_cls``."""
    return {field.name for field in dataclasses.fields(config_cls)}


def declared_default(config_cls, name: str):
    """The default written in the class for field ``name``, before ``__post_init__`` derives anything
    (``dataclasses.MISSING`` when the class declares no such field, None when it has no default)."""
    for field in dataclasses.fields(config_cls):
        if field.name == name:
            if field.default is not dataclasses.MISSING:
                return field.default
            return None if field.default_factory is dataclasses.MISSING else field.default_factory()
    return dataclasses.MISSING


def _read(config, name: str):
    """``config.name``; ``_UNREADABLE`` where the config refuses a global read (per-layer attributes)."""
    try:
        return getattr(config, name, None)
    except Exception:  # transformers' AmbiguousGlobalPerLayerAttributeError and kin
        return _UNREADABLE


def default_depth(defaults) -> int | None:
    """The layer count of the default config, under whichever field name it uses."""
    for name in DEPTH_FIELDS:
        value = _read(defaults, name)
        if isinstance(value, int):
            return value
    return None


def per_layer_lists(config_cls, defaults) -> dict[str, list]:
    """Declared fields of the default config holding one entry per layer."""
    depth = default_depth(defaults)
    found = {}
    for name in sorted(_declared(config_cls)):
        value = _read(defaults, name)
        if isinstance(value, (list, tuple)) and depth and len(value) == depth:
            found[name] = list(value)
    return found


def tiny_depth(config_cls, defaults) -> int:
    """2 layers, or 4 when some per-layer list mixes kinds (so the tiny model keeps the mix)."""
    mixed = any(len(set(map(str, value))) > 1 for value in per_layer_lists(config_cls, defaults).values())
    return 4 if mixed else 2


def _tiny(config_cls, name: str, tiny: int):
    """``tiny``, but never more than a smaller declared integer default (some configs require small values)."""
    default = declared_default(config_cls, name)
    if isinstance(default, int) and not isinstance(default, bool) and 0 < default < tiny:
        return default
    return tiny


def model_sizes(config_cls, defaults) -> dict:
    """Tiny values for the size fields ``config_cls`` declares, with the tiny depth."""
    declared = _declared(config_cls)
    sizes = {}
    for name, tiny in TINY_SIZES.items():
        if name in declared and (_read(defaults, name) is not None or name in SET_WHEN_NONE):
            sizes[name] = _tiny(config_cls, name, tiny)
    for field, other in EQUAL_PAIRS:
        if field in sizes and other in sizes:
            default = declared_default(config_cls, field)
            if isinstance(default, int) and default == declared_default(config_cls, other):
                sizes[field] = sizes[other]
    depth = tiny_depth(config_cls, defaults)
    sizes.update({name: depth for name in DEPTH_FIELDS if name in declared})
    sizes.update({name: depth // 2 for name in HALF_DEPTH_FIELDS if name in declared and _read(defaults, name)})
    return sizes


def compress(kinds: list, depth: int) -> list:
    """A per-layer list cut to ``depth`` entries: its distinct values in order of first appearance, cycled.

    ``["s", "s", "s", "s", "f"] * 7`` becomes ``["s", "f", "s", "f"]`` for depth 4, so every kind
    occurs (at least twice when ``depth`` allows), which layers that share or tie weights by kind need.
    """
    distinct = list(dict.fromkeys(kinds))
    return [distinct[i % len(distinct)] for i in range(depth)]


def shrink_layer_lists(config_cls, defaults, depth: int) -> dict:
    """Per-layer list fields cut to ``depth``; lists of a size field (``intermediate_size``) take its tiny value."""
    shrunk = {}
    for name, value in per_layer_lists(config_cls, defaults).items():
        shrunk[name] = [TINY_SIZES[name]] * depth if name in TINY_SIZES else compress(value, depth)
    pattern = _read(defaults, "attention_types")
    if "attention_types" in _declared(config_cls) and isinstance(pattern, list) and pattern:
        kinds = pattern[0][0]  # GPT-Neo's format: [[kinds, repeats], ...] spelling out one kind per layer
        shrunk["attention_types"] = [[kinds, max(1, depth // len(kinds))]]
    return shrunk


def _rope_for_kinds(defaults, layer_types: list) -> dict:
    """``rope_parameters`` covering every kind in ``layer_types`` when the default keys them by layer kind."""
    rope = _read(defaults, "rope_parameters")
    if not isinstance(rope, dict) or "full_attention" not in rope:
        return {}
    missing = [kind for kind in layer_types if kind not in rope]
    return {"rope_parameters": {**rope, **{kind: dict(rope["full_attention"]) for kind in missing}}} if missing else {}


def apply_window(config_cls, defaults, window: int, layer_types: list | None = None) -> dict:
    """Keyword arguments that switch a sliding window (or attention chunk) of ``window`` tokens on.

    ``layer_types``: the shrunk per-layer kinds, when the config has them; if
    they name only full attention, all but the last layer become sliding so
    the model keeps a mix.
    """
    declared = _declared(config_cls)
    kwargs = {name: window for name in WINDOW_FIELDS if name in declared}
    if "use_sliding_window" in declared:
        kwargs["use_sliding_window"] = True
    if "max_window_layers" in declared:
        kwargs["max_window_layers"] = 1
    if layer_types and "sliding_window" in declared and set(layer_types) == {"full_attention"}:
        kwargs["layer_types"] = ["sliding_attention"] * (len(layer_types) - 1) + ["full_attention"]
        kwargs.update(_rope_for_kinds(defaults, kwargs["layer_types"]))
    return kwargs


def tiny_kwargs(config_cls, window: int) -> dict:
    """All shrinking keyword arguments for ``config_cls``, sub-configs included (as dicts).

    Raises whatever the default config's constructor raises.
    """
    defaults = config_cls()
    kwargs = model_sizes(config_cls, defaults)
    depth = next((kwargs[name] for name in DEPTH_FIELDS if name in kwargs), None)
    if depth is not None:
        kwargs.update(shrink_layer_lists(config_cls, defaults, depth))
    kwargs.update(apply_window(config_cls, defaults, window, kwargs.get("layer_types")))
    for name, sub_cls in (getattr(config_cls, "sub_configs", None) or {}).items():
        if dataclasses.is_dataclass(sub_cls) and name in _declared(config_cls):
            sub = tiny_kwargs(sub_cls, window)
            if sub:
                kwargs[name] = sub
    return kwargs
