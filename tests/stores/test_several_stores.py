"""`datastore=[repo_store, general_store]`: every store drafts under its own name, outputs stay greedy's,
and bad lists are refused with typed one-line errors before any model work."""

from __future__ import annotations

import pytest
import torch

import retrieval_draft
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.drafters.registry import DraftSources, default_names, make_drafters
from retrieval_draft.errors import DatastoreNotFoundError, InvalidInputError
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft_datastore.builder import build
from retrieval_draft_datastore.repo_store import update_repo_store
from tests.conftest import make_tiny_llama
from tests.datastore_fixtures import word_tokenizer

PROMPT_LEN = 12
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def tokenizer():
    """Words w0..w99 (ids 1..100) and [UNK] (id 0): every id of a 101-token model is a word."""
    return word_tokenizer([], extra=100)


@pytest.fixture(scope="module")
def model(tokenizer):
    return make_tiny_llama(seed=0, vocab_size=len(tokenizer))


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return torch.randint(3, len(tokenizer), (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def greedy(model, prompt):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False)


def _text(tokenizer, ids) -> str:
    return " ".join(tokenizer.convert_ids_to_tokens([int(i) for i in ids]))


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tokenizer, greedy):
    """(repo store, general store): the repo's one file holds the prompt and greedy's continuation;
    the general store holds only words that sequence never uses."""
    root = tmp_path_factory.mktemp("several")
    src = root / "src"
    src.mkdir()
    (src / "module.txt").write_text(_text(tokenizer, greedy[0]) + "\n", encoding="utf-8")
    repo = root / "repo-store"
    update_repo_store(src, repo, tokenizer)
    used = set(greedy[0].tolist())
    unused = [i for i in range(3, len(tokenizer)) if i not in used]
    docs = root / "docs"
    docs.mkdir()
    for n in range(3):
        (docs / f"{n}.txt").write_text(_text(tokenizer, unused[n::2] * 2), encoding="utf-8")
    general = root / "general-store"
    build(sorted(str(p) for p in docs.iterdir()), general, tokenizer, progress=False)
    return repo, general


def _generate(model, prompt, **kwargs):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                          do_sample=False, custom_generate=retrieval_draft.generate, **kwargs)


def test_each_store_gets_its_own_named_drafters(stores):
    memory = PluginMemory()
    opened = tuple(memory.stores.open(path) for path in stores)
    sources = DraftSources(stores=opened)
    names = [d.name for d in make_drafters(default_names(sources), sources)]
    assert names == ["prompt", "ngram:repo-store", "ngram:general-store", "suffix:repo-store", "suffix:general-store"]
    alone = DraftSources(store=opened[0])
    assert [d.name for d in make_drafters(default_names(alone), alone)] == ["prompt", "ngram", "suffix"]


def test_two_stores_give_the_plain_greedy_output(model, prompt, greedy, stores, tokenizer):
    for datastore in ([str(stores[0]), str(stores[1])], (stores[1], stores[0])):
        out = _generate(model, prompt, datastore=datastore, draft_tokenizer=tokenizer, draft_memory=PluginMemory())
        assert torch.equal(out, greedy)


def test_opened_stores_may_be_listed_too(model, prompt, greedy, stores):
    memory = PluginMemory()
    opened = [retrieval_draft.open_datastore(path, memory) for path in stores]
    assert torch.equal(_generate(model, prompt, datastore=opened, draft_memory=memory), greedy)


def test_drafts_from_the_repo_store_are_accepted_under_its_name(model, prompt, greedy, stores):
    planner = TreePlanner(tree_budget=16)  # no cost curve: every drafter is asked every step
    stats = DecodeStats()
    out = _generate(model, prompt, datastore=list(stores), draft_planner=planner, draft_stats=stats,
                    draft_learning=False, draft_memory=PluginMemory())
    assert torch.equal(out, greedy)
    assert planner.calibrators["suffix:repo-store"].hits.sum() > 0
    assert planner.calibrators["suffix:general-store"].hits.sum() == 0
    assert stats.mean_accepted > 1.5

    general_only = DecodeStats()
    _generate(model, prompt, datastore=stores[1], draft_planner=TreePlanner(tree_budget=16),
              draft_stats=general_only, draft_learning=False, draft_memory=PluginMemory())
    assert stats.mean_accepted > general_only.mean_accepted


def _refused(model, prompt, datastore, error, match):
    with pytest.raises(error, match=match) as caught:
        _generate(model, prompt, datastore=datastore, draft_memory=PluginMemory())
    assert "\n" not in str(caught.value)


def test_an_empty_list_is_refused(model, prompt):
    _refused(model, prompt, [], InvalidInputError, "empty list")


def test_an_item_of_another_type_is_refused(model, prompt, stores):
    _refused(model, prompt, [stores[0], 7], InvalidInputError, "got int")
    _refused(model, prompt, {"a": stores[0]}, InvalidInputError, "got dict")


def test_one_store_named_twice_is_refused(model, prompt, stores):
    _refused(model, prompt, [stores[0], str(stores[0]) + "/."], InvalidInputError, "twice")


def test_a_missing_path_in_the_list_is_refused_before_any_store_opens(model, prompt, stores, tmp_path, monkeypatch):
    memory = PluginMemory()
    with pytest.raises(DatastoreNotFoundError, match="no datastore at .*nothing: the path does not exist"):
        _generate(model, prompt, datastore=[stores[0], tmp_path / "nothing"], draft_memory=memory)
    assert len(memory.stores) == 0


def test_no_forward_runs_before_a_bad_list_is_refused(model, prompt, monkeypatch):
    calls = []
    monkeypatch.setattr(model, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(InvalidInputError):
        _generate(model, prompt, datastore=[], draft_memory=PluginMemory())
    assert calls == []


def test_the_cli_takes_datastore_more_than_once(monkeypatch, stores):
    import retrieval_draft.sessions.session
    from retrieval_draft_datastore.cli import main as cli_main

    seen = []

    def capture(model_path, datastore_path):
        seen.append(datastore_path)
        raise InvalidInputError("stop here")

    monkeypatch.setattr(retrieval_draft.sessions.session, "load_session", capture)
    assert cli_main(["generate", "--prompt", "x", "--datastore", str(stores[0]), "--datastore", str(stores[1])]) == 2
    assert seen == [[str(stores[0]), str(stores[1])]]


def test_the_cli_refuses_a_missing_second_store_in_one_line_before_loading_a_model(monkeypatch, capsys, stores,
                                                                                   tmp_path):
    import retrieval_draft.model.models
    from retrieval_draft_datastore.cli import main as cli_main

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    for name in ("load_model", "load_tokenizer", "load_model_and_tokenizer"):
        monkeypatch.setattr(retrieval_draft.model.models, name, no_loading)
    missing = tmp_path / "nothing"
    code = cli_main(["generate", "--prompt", "x", "--datastore", str(stores[0]), "--datastore", str(missing)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and str(missing) in err


def test_stores_in_folders_of_one_name_are_told_apart_by_position():
    from types import SimpleNamespace

    from retrieval_draft.drafters.registry import store_labels

    stores = tuple(SimpleNamespace(path=f"/{where}/store") for where in ("a", "b", "c"))
    assert store_labels(stores) == ["store#1", "store#2", "store#3"]
    assert store_labels((SimpleNamespace(path="/a/repo"), SimpleNamespace(path="/b/store"))) == ["repo", "store"]
    assert store_labels(stores[:1]) == [""]
