"""NgramDrafter and SuffixDrafter propose the corpus's continuations, weighted by frequency."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval_draft.draft import Draft, Drafter
from retrieval_draft.drafters.datastore import datastore_drafters
from retrieval_draft.drafters.ngram import NgramDrafter
from retrieval_draft.drafters.suffix import MAX_MATCH, SuffixDrafter
from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.builder import build
from tests.datastore_fixtures import word_tokenizer

WORDS = "a b c d e f x y z q".split()
# "a b" is followed by "c d e" three times and "c d f" once; "x y" only at a document end.
DOCS = ["a b c d e a b c d e", "a b c d f z", "a b c d e q x y"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("abcd")
    for i, doc in enumerate(DOCS):
        (root / f"{i}.txt").write_text(doc)
    tokenizer = word_tokenizer(WORDS)
    build([str(root / f"{i}.txt") for i in range(len(DOCS))], root / "ds", tokenizer, progress=False)
    return root / "ds", tokenizer


def _ids(tokenizer, text):
    return np.array(tokenizer(text)["input_ids"], dtype=np.int64)


def _words(tokenizer, draft: Draft):
    return tokenizer.convert_ids_to_tokens(draft.tokens.tolist())


def test_datastore_drafters_returns_both_kinds_as_drafters(setup):
    path, tokenizer = setup
    drafters = datastore_drafters(path, vocab_size=len(tokenizer))
    assert [type(d) for d in drafters] == [NgramDrafter, SuffixDrafter]
    assert all(isinstance(d, Drafter) for d in drafters)
    with pytest.raises(InvalidInputError):
        datastore_drafters(path, vocab_size=len(tokenizer), kinds=("nope",))


def test_suffix_drafter_proposes_c_d_after_a_b_with_frequency_weights(setup):
    path, tokenizer = setup
    suffix = SuffixDrafter(open_datastore(path), pseudo=0.0)
    drafts = suffix.propose(_ids(tokenizer, "z a b"), 3)
    assert _words(tokenizer, drafts[0]) == ["c", "d", "e"]
    np.testing.assert_allclose(drafts[0].probs, [1.0, 1.0, 0.75])
    assert len(drafts) == 1  # every occurrence of "a b" continues with "c"


def test_suffix_drafter_prefers_the_longest_match(setup):
    path, tokenizer = setup
    suffix = SuffixDrafter(open_datastore(path), pseudo=0.0)
    assert suffix.longest_match(_ids(tokenizer, "z z d e a b"))[0] == 4  # "d e a b" occurs once
    drafts = suffix.propose(_ids(tokenizer, "z z d e a b"), 4)
    assert _words(tokenizer, drafts[0]) == ["c", "d", "e"]  # that document ends after "e"
    np.testing.assert_allclose(drafts[0].probs, [1.0, 1.0, 1.0])


def test_suffix_drafter_offers_alternatives_as_separate_branches(setup):
    path, tokenizer = setup
    drafts = SuffixDrafter(open_datastore(path), pseudo=0.0).propose(_ids(tokenizer, "d"), 2)
    assert [_words(tokenizer, d) for d in drafts] == [["e", "a"], ["f", "z"]]
    np.testing.assert_allclose([d.probs[0] for d in drafts], [0.75, 0.25])


def test_pseudo_counts_shrink_probabilities_backed_by_few_occurrences(setup):
    path, tokenizer = setup
    store = open_datastore(path)
    # "a b" -> "c" -> "d" in all 4 occurrences, then "e" in 3 of them: counts 4/4, 4/4, 3/4.
    suffix = SuffixDrafter(store, pseudo=1.0).propose(_ids(tokenizer, "z a b"), 3)
    np.testing.assert_allclose(suffix[0].probs, [4 / 5, 4 / 5, 3 / 5])
    # "d e a b" occurs once: one occurrence is weak evidence, 1 / (1 + 1) per token.
    single = SuffixDrafter(store, pseudo=1.0).propose(_ids(tokenizer, "z z d e a b"), 3)
    np.testing.assert_allclose(single[0].probs, [0.5, 0.5, 0.5])
    ngram = NgramDrafter(store, widths=(1,), pseudo=1.0).propose(_ids(tokenizer, "a b"), 3)
    assert ngram[0].probs[0] == pytest.approx(4 / 5)
    with pytest.raises(ValueError):
        SuffixDrafter(store, pseudo=-1.0)


def test_continuations_never_cross_a_document_separator(setup):
    path, tokenizer = setup
    for drafter in datastore_drafters(path, vocab_size=len(tokenizer)):
        assert drafter.propose(_ids(tokenizer, "x y"), 4) == []


def test_ngram_drafter_expands_top_children_with_count_over_total(setup):
    path, tokenizer = setup
    drafts = NgramDrafter(open_datastore(path), widths=(2, 2, 2), pseudo=0.0).propose(_ids(tokenizer, "a b"), 3)
    paths = {tuple(_words(tokenizer, d)): d.probs.tolist() for d in drafts}
    assert paths == {("c", "d", "e"): pytest.approx([1.0, 1.0, 0.75]), ("c", "d", "f"): pytest.approx([1.0, 1.0, 0.25])}
    greedy = NgramDrafter(open_datastore(path), widths=(1,)).propose(_ids(tokenizer, "a b"), 3)
    assert [_words(tokenizer, d) for d in greedy] == [["c", "d", "e"]]
    shallow = NgramDrafter(open_datastore(path), widths=(1,), max_depth=2).propose(_ids(tokenizer, "a b"), 3)
    assert [_words(tokenizer, d) for d in shallow] == [["c", "d"]]


def test_drafts_are_deterministic_and_respect_max_len(setup):
    path, tokenizer = setup
    for drafter in datastore_drafters(path, vocab_size=len(tokenizer)):
        first = drafter.propose(_ids(tokenizer, "e a b c"), 2)
        second = drafter.propose(_ids(tokenizer, "e a b c"), 2)
        assert [d.tokens.tolist() for d in first] == [d.tokens.tolist() for d in second]
        assert first and all(1 <= len(d) <= 2 for d in first)
        assert drafter.propose(_ids(tokenizer, "a"), 0) == []


def test_unknown_or_out_of_vocabulary_context_ids_give_no_match(setup):
    path, tokenizer = setup
    for drafter in datastore_drafters(path, vocab_size=len(tokenizer)):
        assert drafter.propose(np.array([len(tokenizer) + 5, 10**9], np.int64), 4) == []
        assert drafter.propose(np.array([], np.int64), 4) == []
    suffix = SuffixDrafter(open_datastore(path))
    assert suffix.longest_match(np.array([*_ids(tokenizer, "a"), 10**9, *_ids(tokenizer, "a b")]))[0] == 2


def test_propose_reads_a_bounded_tail_of_the_context(setup):
    """A propose's work does not grow with the context: a 5,000-token context drafts exactly what its
    last tokens do (the n-gram drafter's ``max_order``, the suffix drafter's 16). Its time per call
    is measured by the benchmark (``tools/bench/store_scale.py``), not here."""
    path, tokenizer = setup
    tail = _ids(tokenizer, "q x a b c d e a b")
    noise = np.random.default_rng(0).integers(1, len(tokenizer), 5000)
    ngram, suffix = datastore_drafters(path, vocab_size=len(tokenizer))
    for drafter, keep in ((ngram, open_datastore(path).params["max_order"]), (suffix, MAX_MATCH)):
        long_drafts = drafter.propose(np.concatenate([noise, tail]), 8)
        short_drafts = drafter.propose(np.concatenate([noise[-(keep - tail.size):], tail]) if keep > tail.size
                                       else tail[-keep:], 8)
        assert long_drafts and _same(long_drafts, short_drafts)


def _same(a: list[Draft], b: list[Draft]) -> bool:
    return [(d.tokens.tolist(), d.probs.tolist()) for d in a] == [(d.tokens.tolist(), d.probs.tolist()) for d in b]
