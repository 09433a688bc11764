"""The causal-LM architectures of the installed transformers, and tiny random models of them.

``causal_lm_architectures()`` lists every entry of transformers'
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` as (model_type, class name): nothing is
picked by hand, so a new transformers release brings its new models in.

``set_aside_reason`` states the rule for what is *not* a decoder-only text
causal LM, read from facts about the config class and the model class:

1. the config's ``is_encoder_decoder`` defaults to True: the class is the
   decoder half of an encoder-decoder model (BART, Marian, Whisper, ...);
2. the config has an ``is_decoder`` flag defaulting to False and an
   ``add_cross_attention`` flag: a bidirectional encoder with an LM head
   (BERT, RoBERTa, ELECTRA, ...), causal only when reconfigured as a decoder;
3. the class is a ``...ForConditionalGeneration``: it conditions on images or audio;
4. the config holds a sub-config for another modality (vision, audio, image
   quantiser): the same class under a text-only model type is checked there,
   otherwise the model needs non-text inputs;
5. ``LEFTOVERS``: the few that pass 1-4 yet are not decoder-only text causal
   LMs, each with its reason.

``tiny_model(model_type)`` builds a randomly initialised model of the
architecture from its config class with every size field shrunk (the field
names vary: ``n_embd``, ``d_model``, ``n_layer``, ...; see ``tests/model/zoo_sizes.py``),
its sliding window or attention chunk made small and switched on, and returns
it with a word on the kind of window found. ``CONFIG_FIXES`` lists, with
reasons, the few architectures whose default config cannot give a faithful
tiny model as it stands. A model that cannot be built raises ``ZooBuildError``
with the reason.
"""

from __future__ import annotations

import dataclasses

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from tests.model.zoo_sizes import declared_default, tiny_kwargs

# Special token ids of every tiny model; random prompts draw ids from [FIRST_PROMPT_ID, vocab).
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_PROMPT_ID = 3

# Sub-config names that mean a modality other than text.
_OTHER_MODALITIES = ("vision", "audio", "image", "vq", "speech")

LEFTOVERS = {
    "trocr": "decoder of a vision encoder-decoder (TrOCR): every layer cross-attends to image features",
    "reformer": "Reformer: LSH/axial attention with its own cache, no attention mask or position ids per token",
    "xlnet": "XLNet: a permutation language model with its own memory cache, not a causal-mask decoder",
    "xlm": "XLM: a masked language model (bidirectional attention by default)",
    "fuyu": "multimodal: Fuyu's causal LM takes image patches in its input sequence",
    "gemma4_assistant": "a drafter for Gemma 4: reads the target model's embeddings and KV states, ignores input_ids",
    "gemma4_unified_assistant": "a drafter for Gemma 4: reads the target model's embeddings and KV states, "
    "ignores input_ids",
}

# Architectures whose default config builds no model, or one without the layer kinds their
# checkpoints have (hybrids whose default is all attention or all Mamba): (config keyword arguments, why).
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
CONFIG_FIXES = {
    "cohere_compass_text": (
        {"rope_parameters": {"full_attention": dict(_ROPE), "sliding_attention": dict(_ROPE)}},
        "the default config has no RoPE parameters; the model reads them per layer type",
    ),
    "lfm2": (
        {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "full_attention"]},
        "the default config has no full_attn_idxs, which makes every layer attention (LFM2 mixes in conv layers)",
    ),
    "bamba": (
        {"num_hidden_layers": 4, "attn_layer_indices": [1, 3]},
        "the default config has no attn_layer_indices, which makes every layer Mamba (Bamba mixes in attention)",
    ),
    "granitemoehybrid": (
        {"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "attention"]},
        "the default config has no layer_types, which makes every layer Mamba (the hybrid mixes in attention)",
    ),
    "recurrent_gemma": (
        {"num_hidden_layers": 3},
        "block_types repeats (recurrent, recurrent, attention): fewer than 3 layers hold no attention layer",
    ),
    "xlstm": (
        {"qk_dim_factor": 1.0},
        "its cache rounds the query/key width up to a multiple of 64 and its layers do not; "
        "at hidden size 64 only a factor of 1 keeps them equal",
    ),
    "lfm2_moe": (
        {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "full_attention"]},
        "the default config has no layer_types, which Lfm2MoeDecoderLayer reads",
    ),
    "dots3_note_text": (
        {"swa_num_attention_heads": 4, "swa_num_key_value_heads": 4, "swa_q_lora_rank": 32, "swa_kv_lora_rank": 16,
         "swa_head_dim": 16, "swa_qk_nope_head_dim": 8, "swa_v_head_dim": 16},
        "the sliding layers' sizes are keyword-only swa_* arguments, not config fields",
    ),
    "qwen4_exp_text": (
        {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 16,
         "indexer_compress_ratio": 4},
        "the default config's indexed-attention layers need the QSA indexer sizes, which default to None",
    ),
}


class ZooBuildError(Exception):
    """A tiny model of an architecture could not be built; the message says why."""


def causal_lm_architectures() -> list[tuple[str, str]]:
    """Every (model_type, class name) pair of the installed transformers' causal-LM auto mapping."""
    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())


def config_class(model_type: str):
    """The config class registered for ``model_type``."""
    return CONFIG_MAPPING[model_type]


def _modality_sub_configs(config_cls) -> list[str]:
    """Names of the config's sub-configs for a modality other than text."""
    names = getattr(config_cls, "sub_configs", None) or {}
    return [name for name in names if any(word in name for word in _OTHER_MODALITIES)]


def _text_only_twin(model_type: str, class_name: str) -> str | None:
    """Another model type mapped to the same class whose config has no other-modality sub-config."""
    for other, other_class in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if other != model_type and other_class == class_name and not _modality_sub_configs(config_class(other)):
            return other
    return None


def set_aside_reason(model_type: str, class_name: str) -> str | None:
    """Why ``model_type`` is not checked as a decoder-only text causal LM (None: it is checked).

    Applies rules 1-5 of the module docstring in order.
    """
    cls = config_class(model_type)
    if declared_default(cls, "is_encoder_decoder") is True:
        return "decoder of an encoder-decoder model (config is_encoder_decoder=True)"
    encoder_flags = declared_default(cls, "is_decoder"), declared_default(cls, "add_cross_attention")
    if encoder_flags[0] is False and encoder_flags[1] is not dataclasses.MISSING:
        return "bidirectional encoder with an LM head (config is_decoder=False, add_cross_attention)"
    if class_name.endswith("ForConditionalGeneration"):
        return f"multimodal: {class_name} conditions on non-text inputs"
    modalities = _modality_sub_configs(cls)
    if modalities:
        twin = _text_only_twin(model_type, class_name)
        if twin is not None:
            return f"multimodal config; its text model {class_name} is checked as {twin!r}"
        return f"multimodal: its config carries {', '.join(modalities)} (inputs other than text)"
    return LEFTOVERS.get(model_type)


def checked_architectures() -> list[tuple[str, str]]:
    """The (model_type, class name) pairs that ``set_aside_reason`` keeps."""
    return [(mt, name) for mt, name in causal_lm_architectures() if set_aside_reason(mt, name) is None]


def window_kind(config) -> str:
    """'none', 'all-layer sliding', 'per-layer sliding' or 'chunked', read from a built config."""
    if getattr(config, "attention_chunk_size", None):
        return "chunked"
    layer_kinds = set(getattr(config, "layer_types", None) or getattr(config, "attention_layers", None) or ())
    if any(word in str(kind) for kind in layer_kinds for word in ("sliding", "local", "chunked")):
        return "per-layer sliding"
    if getattr(config, "sliding_window", None) or getattr(config, "sliding_window_size", None):
        return "all-layer sliding"
    return "none"


def tiny_config(model_type: str, window: int = 8, attn_implementation: str = "sdpa"):
    """The config of ``model_type`` with tiny sizes, the given window and special ids (see module docstring)."""
    cls = config_class(model_type)
    kwargs = tiny_kwargs(cls, window)
    kwargs.update(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    known = {field.name for field in dataclasses.fields(cls)}
    kwargs = {name: value for name, value in kwargs.items() if name in known}
    kwargs.update(CONFIG_FIXES.get(model_type, ({}, ""))[0])
    return cls(attn_implementation=attn_implementation, **kwargs)


# A tiny model has well under a million parameters; more means a size field was not shrunk.
MAX_PARAMETERS = 2_000_000


def _build(model_type: str, class_name: str, window: int, seed: int, attn: str):
    """The model built with attention implementation ``attn``, after a parameter count on the meta device."""
    config = tiny_config(model_type, window, attn)
    model_cls = getattr(transformers, class_name)
    with torch.device("meta"):
        count = sum(p.numel() for p in model_cls(config).parameters())
    if count > MAX_PARAMETERS:
        raise ZooBuildError(f"not tiny: {count:,} parameters (a size field this harness does not shrink)")
    torch.manual_seed(seed)
    return model_cls(config)


def tiny_model(model_type: str, window: int = 8, seed: int = 0) -> tuple[torch.nn.Module, str]:
    """A tiny randomly initialised model of ``model_type`` (fp32, eval mode) and its window kind.

    SDPA attention where the class supports it, else eager. The generation
    config's EOS and pad ids are ``EOS_ID`` and ``PAD_ID``, below ``FIRST_PROMPT_ID``.
    Raises ZooBuildError (reason in the message) when the model cannot be built.
    """
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    model_cls = getattr(transformers, class_name, None)
    if model_cls is None:
        raise ZooBuildError(f"transformers exports no class {class_name}")
    attn = "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    try:
        model = _build(model_type, class_name, window, seed, attn)
    except ZooBuildError:
        raise
    except Exception as error:  # config and model constructors raise many unrelated types
        raise ZooBuildError(f"{type(error).__name__}: {error}".splitlines()[0][:300]) from error
    model = model.float().eval()
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    return model, window_kind(model.config)
