"""Every decoder-only causal LM of the installed transformers: the plugin's greedy output equals plain
``generate`` (tokens, and logits within ``zoo_check.LOGIT_TOLERANCE``) with drafts accepted, or the
plugin refuses the model with a stated reason (issue 23).

Architectures come from transformers' auto mapping (``tests/model/zoo_models.py``), not from a list here;
each is checked on a tiny random model with its window switched on (``tests/model/zoo_check.py``).
About a minute on one thread (2-core CPU): deselect with ``-m "not model_zoo"``.
"""

import pytest
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from tests.model.zoo_models import (
    CONFIG_FIXES,
    LEFTOVERS,
    causal_lm_architectures,
    checked_architectures,
    set_aside_reason,
    tiny_model,
)
from tests.model.zoo_check import IDENTICAL, NOT_BUILT, PLAIN_FAILED, REFUSED, check, one_numba_thread

pytestmark = pytest.mark.model_zoo


@pytest.fixture(scope="module", autouse=True)
def _numba_on_one_thread():
    with one_numba_thread():
        yield


# model_type -> a substring of the plugin's UnsupportedModelError message. Recurrent caches
# (state-space, linear-attention, convolution states) cannot be cut back to the accepted tokens.
EXPECTED_REFUSALS = {
    "bailing_hybrid": "recurrent",
    "bamba": "recurrent",
    "falcon_h1": "recurrent",
    "falcon_mamba": "recurrent",
    "granitemoehybrid": "recurrent",
    "inkling_text": "recurrent",
    "inkling2_loop_text": "recurrent",
    "inkling2_text": "recurrent",
    "jamba": "recurrent",
    "kimi_linear": "recurrent",
    "lara_mini": "recurrent",
    "lfm2": "recurrent",
    "lfm2_moe": "recurrent",
    "lfm3": "recurrent",
    "mamba": "recurrent",
    "mamba2": "recurrent",
    "minimax": "recurrent",
    "nemotron_h": "recurrent",
    "olmo_hybrid": "recurrent",
    "qwen3_5_moe_text": "recurrent",
    "qwen3_5_text": "recurrent",
    "qwen3_next": "recurrent",
    "qwen4_exp_text": "recurrent",
    "recurrent_gemma": "recurrent",
    "rwkv": "recurrent",
    "xlstm": "recurrent",
    "zamba": "recurrent",
    "zamba2": "recurrent",
    "zaya": "recurrent",
    # OpenAI GPT's forward takes no KV cache at all: it has nothing to verify against.
    "openai-gpt": "no KV cache",
    # Compressed-attention caches (DeepSeek-V4) summarise blocks of tokens: no row per token to drop.
    "deepseek_v4": "compressed",
    # CPM-Ant's position bias assumes one new token after a cache.
    "cpmant": "cannot score several new tokens after a cache",
}

# model_type -> a substring of the error: transformers itself (5.24, the test extra's pin) cannot build
# or run these tiny models.
TRANSFORMERS_GAPS = {
    "dbrx": "DbrxAttentionConfig' object has no attribute 'rope_theta'",
    "blt": "'BltConfig' object has no attribute 'num_hidden_layers'",
    # plain generate with the sliding window switched on: a mask of the window's size meets the whole cache
    "dory": "must match the size of tensor b",
}

CHECKED = checked_architectures()


@pytest.mark.parametrize("model_type, class_name", CHECKED, ids=[model_type for model_type, _ in CHECKED])
def test_plugin_output_equals_greedy_with_drafts_accepted_or_is_refused_for_a_stated_reason(model_type, class_name):
    outcome = check(model_type, class_name)
    if model_type in TRANSFORMERS_GAPS:
        assert outcome.result in (NOT_BUILT, PLAIN_FAILED), outcome
        assert TRANSFORMERS_GAPS[model_type] in outcome.detail, outcome
    elif model_type in EXPECTED_REFUSALS:
        assert outcome.result == REFUSED, outcome
        assert EXPECTED_REFUSALS[model_type] in outcome.detail, outcome
    else:
        assert outcome.result == IDENTICAL, outcome
        assert outcome.tokens_per_step > 1.0 and outcome.mode in ("tree", "chain"), outcome


def test_every_architecture_is_checked_or_set_aside_with_a_reason():
    assert dict(causal_lm_architectures()) == dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    checked = dict(CHECKED)
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        reason = set_aside_reason(model_type, class_name)
        assert (model_type in checked) == (reason is None), model_type
        assert reason is None or len(reason) >= 20, (model_type, reason)


def test_the_expectation_lists_name_only_architectures_that_are_checked():
    checked = {model_type for model_type, _ in CHECKED}
    assert set(EXPECTED_REFUSALS) <= checked
    assert set(TRANSFORMERS_GAPS) <= checked
    assert set(CONFIG_FIXES) <= checked
    assert not set(EXPECTED_REFUSALS) & set(TRANSFORMERS_GAPS)


def test_leftovers_are_only_what_the_general_rules_miss():
    enumerated = dict(causal_lm_architectures())
    assert set(LEFTOVERS) <= set(enumerated)
    for model_type in LEFTOVERS:
        reason = set_aside_reason(model_type, enumerated[model_type])
        assert reason == LEFTOVERS[model_type], f"{model_type} is already set aside by a rule: {reason}"


@pytest.mark.parametrize(
    "model_type, decoder_only",
    [("llama", True), ("gpt2", True), ("mistral", True), ("llama4_text", True),
     ("bart", False), ("whisper", False), ("bert", False), ("roberta", False),
     ("gemma3", False), ("git", False), ("musicgen", False)],
)
def test_the_rule_keeps_decoders_and_sets_aside_encoders_encoder_decoders_and_multimodal_models(
    model_type, decoder_only
):
    assert (set_aside_reason(model_type, dict(causal_lm_architectures())[model_type]) is None) == decoder_only


@pytest.mark.parametrize(
    "model_type, kind",
    [("mistral", "all-layer sliding"), ("starcoder2", "all-layer sliding"), ("gemma3_text", "per-layer sliding"),
     ("qwen2", "per-layer sliding"), ("llama4_text", "chunked"), ("llama", "none")],
)
def test_tiny_models_switch_their_window_on_at_the_size_asked(model_type, kind):
    model, found = tiny_model(model_type, window=8)
    config = model.config
    assert found == kind
    spans = {getattr(config, "sliding_window", None), getattr(config, "attention_chunk_size", None)} - {None}
    assert spans == (set() if kind == "none" else {8})
    if kind == "per-layer sliding":
        assert {"sliding_attention", "full_attention"} <= set(config.layer_types)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
