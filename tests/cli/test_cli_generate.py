"""``retrieval-draft generate``'s flags on a tiny random model saved as a folder (``--model DIR``):
each flag reaches the request it names, and the text printed is what the model alone generates
(greedy), or the same sample for the same seed. The real model's runs: ``test_real_cli.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from retrieval_draft.sessions.session import Session
from tests.datastore_fixtures import stdlib_corpus
from tests.doc_preamble import tiny_model_folder

NEW = 12  # new tokens per run


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_model_folder(tmp_path_factory.mktemp("cli-model"))


@pytest.fixture(scope="module")
def loaded(folder):
    from retrieval_draft.model.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(folder))


@pytest.fixture(scope="module")
def prompt(tmp_path_factory) -> str:
    """The first lines of a stdlib module: text the tiny model's tokenizer was trained on."""
    corpus = stdlib_corpus(tmp_path_factory.mktemp("prompt-src"))
    return "".join((corpus / "heapq.py").read_text().splitlines(keepends=True)[:12])


@pytest.fixture()
def requests(monkeypatch) -> list:
    """The ``GenerationRequest`` of every generation the program runs, in order."""
    seen, real = [], Session.generate_ids

    def spy(self, ids, request, streamer=None):
        seen.append(request)
        return real(self, ids, request, streamer)

    monkeypatch.setattr(Session, "generate_ids", spy)
    return seen


def generate(folder: Path, extra: list[str], capsys) -> str:
    """The text ``retrieval-draft generate --model folder ...`` prints (asserting exit code 0)."""
    from retrieval_draft_datastore.cli import main

    capsys.readouterr()
    code = main(["generate", "--model", str(folder), "--max-new-tokens", str(NEW), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def greedy(loaded, ids: list[int]) -> str:
    """What the model alone generates greedily after ``ids``, as the program prints it."""
    model, tokenizer = loaded
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW)
    assert out.shape[1] == len(ids) + NEW  # no early end: the comparison covers every new token
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True) + "\n\n"  # the streamer's, then ours


def test_prompt_file_generates_from_the_files_text(folder, loaded, prompt, tmp_path, capsys, requests):
    (tmp_path / "prompt.txt").write_text(prompt, encoding="utf-8")
    out = generate(folder, ["--prompt-file", str(tmp_path / "prompt.txt")], capsys)
    assert requests[0].prompt == prompt and not requests[0].chat
    assert out == greedy(loaded, loaded[1](prompt)["input_ids"])


def test_chat_generates_after_the_models_chat_template(folder, loaded, prompt, capsys, requests):
    out = generate(folder, ["--chat", "--prompt", prompt], capsys)
    templated = loaded[1].apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                              return_dict=False)
    assert requests[0].chat and list(templated) != loaded[1](prompt)["input_ids"]
    assert out == greedy(loaded, list(templated))


def test_a_fixed_tree_over_a_datastore_and_named_drafters_generates_what_the_model_does(
        folder, loaded, prompt, tmp_path, capsys, requests):
    from retrieval_draft_datastore.cli import main

    corpus = stdlib_corpus(tmp_path / "corpus")
    assert main(["build", str(corpus), "--out", str(tmp_path / "store"), "--model", str(folder), "--quiet"]) == 0
    out = generate(folder, ["--prompt", prompt, "--datastore", str(tmp_path / "store"), "--drafters",
                            "prompt,ngram,suffix", "--fixed-tree", "--tree-budget", "8", "--max-draft-len", "4"],
                   capsys)
    (request,) = requests
    assert (request.adaptive_tree, request.tree_budget, request.max_draft_len) == (False, 8, 4)
    assert request.drafters == "prompt,ngram,suffix"
    assert out == greedy(loaded, loaded[1](prompt)["input_ids"])


def test_the_same_seed_draws_the_same_sample_and_another_seed_another(folder, prompt, capsys, requests):
    sampling = ["--prompt", prompt, "--temperature", "1.5", "--top-k", "50", "--top-p", "0.95"]
    first, again, other = (generate(folder, [*sampling, "--seed", seed], capsys) for seed in ("3", "3", "4"))
    assert [r.seed for r in requests] == [3, 3, 4]
    assert requests[0].sampling == {"temperature": 1.5, "top_k": 50, "top_p": 0.95}
    assert first == again and first != other and first.strip()


def test_compare_labels_its_baseline_row_by_what_ran(folder, prompt, capsys):
    greedy_run = generate(folder, ["--prompt", prompt, "--compare"], capsys)
    sampled_run = generate(folder, ["--prompt", prompt, "--compare", "--temperature", "0.7"], capsys)
    assert "| HF greedy generate |" in greedy_run and "| HF sampling generate |" not in greedy_run
    assert "| HF sampling generate |" in sampled_run and "greedy" not in sampled_run
