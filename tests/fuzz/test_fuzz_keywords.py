"""Random values for our ``generate`` keywords: each call gives HF greedy's output exactly (and its
streamer and stats agree with it), or a typed one-line error before any forward. Where every value
drawn is one the docs accept, the call must give the output.

Per keyword a draw leaves it out, takes a value the docs accept (``VALID``), or takes anything
(``ANYTHING``: wrong types, out-of-range numbers, names, other keywords' objects).
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import retrieval_draft
from retrieval_draft.config import DEFAULTS, DraftConfig
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.errors import RetrievalDraftError
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft_datastore.builder import build
from tests.conftest import make_tiny_llama, random_prompt
from tests.datastore_fixtures import word_tokenizer
from tests.fuzz.profiles import examples

WORDS = "a b c d e f x y z q".split()
NEW_TOKENS = 12


class Recorder:
    """A streamer that keeps what it is given."""

    def __init__(self) -> None:
        self.pieces: list[torch.Tensor] = []
        self.ended = False

    def put(self, tokens: torch.Tensor) -> None:
        self.pieces.append(tokens.reshape(-1))

    def end(self) -> None:
        self.ended = True


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """The tiny model (counting its forwards), a prompt, HF greedy's output, and a small store."""
    root = tmp_path_factory.mktemp("fuzz-keywords")
    (root / "doc.txt").write_text("a b c d e a b c d e f x y z " * 20)
    build([str(root / "doc.txt")], root / "store", word_tokenizer(WORDS), progress=False)
    model = make_tiny_llama(seed=11)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    prompt = random_prompt(11, length=12, repeat=3)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                              do_sample=False)
    return {"model": model, "forwards": forwards, "prompt": prompt, "expected": expected, "store": root / "store",
            "missing": root / "missing"}


def valid_values(store_token: str) -> dict:
    """Keyword -> a strategy of values the docs accept (``store_token`` stands for the store's path)."""
    names = st.lists(st.sampled_from(["prompt", "recycle", "candidates"]), min_size=1, max_size=3)
    strategies = {
        "tree_budget": st.integers(0, 48) | st.integers(0, 48).map(np.int64),
        "max_draft_len": st.integers(1, 48) | st.integers(1, 48).map(np.int32),
        "adaptive_tree": st.booleans() | st.booleans().map(np.bool_),
        "draft_learning": st.booleans(),
        "draft_seed": st.none() | st.integers(-(2**63), 2**64 - 1),
        "drafters": st.none() | names | names.map(",".join) | st.builds(lambda: [PromptLookupDrafter()]),
        "datastore": st.none() | st.just(store_token),
        "draft_tokenizer": st.none() | st.builds(lambda: word_tokenizer(WORDS)),
        "draft_planner": st.none() | st.builds(TreePlanner, tree_budget=st.integers(0, 16)),
        "draft_streamer": st.none() | st.builds(Recorder),
        "draft_stats": st.none() | st.builds(retrieval_draft.DecodeStats),
        "draft_memory": st.none() | st.builds(retrieval_draft.PluginMemory, persist=st.just(False)),
    }
    for field in fields(DraftConfig):  # a setting added later: its default, at least
        strategies.setdefault(field.name, st.just(getattr(DEFAULTS, field.name)))
    return strategies


ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 5000), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
    st.text(max_size=8), st.sampled_from(["prompt", "ngram", "suffix", "history", "all", "prompt,ngram", "bogus", ""]),
    st.lists(st.sampled_from(["prompt", "ngram", "history", "bogus"]), max_size=3),
    st.lists(st.integers(-3, 3), max_size=3), st.integers(-5, 100).map(np.int64), st.floats(-5, 100).map(np.float32),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.just(object()), st.just("STORE"),
    st.just("MISSING"), st.builds(lambda: [PromptLookupDrafter()]), st.builds(lambda: [[PromptLookupDrafter()]] * 2),
    st.builds(TreePlanner), st.builds(retrieval_draft.DecodeStats), st.builds(Recorder),
    st.builds(lambda: word_tokenizer(list(reversed(WORDS)))), st.builds(lambda: [Recorder(), Recorder()]),
)


def ours() -> list[str]:
    return list(valid_values("STORE"))


@st.composite
def keyword_draws(draw) -> tuple[dict, bool]:
    """(keyword -> value, whether every value was drawn from the accepted ones)."""
    valid = valid_values("STORE")
    chosen, all_valid = {}, True
    modes = ["absent", "valid"] + (["anything"] if draw(st.integers(0, 2)) else [])  # a third draw only accepted values
    for keyword in sorted(valid):
        mode = draw(st.sampled_from(modes))
        if mode == "absent":
            continue
        chosen[keyword] = draw(valid[keyword] if mode == "valid" else ANYTHING)
        all_valid = all_valid and mode == "valid"
    instances = isinstance(chosen.get("drafters"), list) and chosen["drafters"] and not isinstance(
        chosen["drafters"][0], str)
    if instances and chosen.get("datastore") is not None:
        all_valid = False  # documented: datastore= with drafter instances is refused
    return chosen, all_valid


def resolved(chosen: dict, scene: dict) -> dict:
    """The draws with the path stand-ins replaced by real paths."""
    paths = {"STORE": str(scene["store"]), "MISSING": str(scene["missing"])}
    return {k: paths.get(v, v) if isinstance(v, str) else v for k, v in chosen.items()}


def test_the_draws_cover_every_keyword_of_ours():
    import inspect

    params = list(inspect.signature(retrieval_draft.generate).parameters.values())
    start = [p.name for p in params].index("assistant_model") + 1
    assert set(ours()) == {p.name for p in params[start:] if p.kind is not inspect.Parameter.VAR_KEYWORD}


@settings(max_examples=examples(60))
@given(draw=keyword_draws())
def test_random_keywords_give_the_exact_output_or_one_typed_line(scene, draw):
    chosen, all_valid = draw
    kwargs = resolved(chosen, scene)
    model, prompt, expected = scene["model"], scene["prompt"], scene["expected"]
    scene["forwards"].clear()
    try:
        got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                             do_sample=False, custom_generate=retrieval_draft.generate, **kwargs)
    except RetrievalDraftError as error:
        assert not all_valid, f"refused accepted values {chosen!r}: {error}"
        assert "\n" not in str(error) and scene["forwards"] == [], repr(error)
        event(f"refused: {type(error).__name__}")
        return
    assert torch.equal(got, expected), chosen
    streamer, stats = kwargs.get("draft_streamer"), kwargs.get("draft_stats")
    if isinstance(streamer, Recorder):
        assert streamer.ended and torch.equal(torch.cat(streamer.pieces), got[0])
    if isinstance(stats, retrieval_draft.DecodeStats):
        assert stats.new_tokens == NEW_TOKENS
    event("exact output" + (" (every value accepted)" if all_valid else " (some value from anything)"))
