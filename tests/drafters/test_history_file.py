"""A saved output history loads back identically; bad files raise typed errors."""

import numpy as np
import pytest

from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.errors import CorruptHistoryError, TokenIdOutOfRangeError, TokenizerMismatchError
from tests.datastore_fixtures import word_tokenizer


def filled() -> HistoryDrafter:
    history = HistoryDrafter()
    history.add(np.array([1, 2, 3, 4, 5]))
    history.add(np.array([7, 8, 9]))
    return history


def test_a_saved_history_drafts_what_the_original_drafts(tmp_path):
    original = filled()
    original.save(tmp_path / "h.npz")
    loaded = HistoryDrafter.load(tmp_path / "h.npz", vocab_size=10)
    assert loaded.size == original.size
    context = np.array([6, 2, 3])
    assert [d.tokens.tolist() for d in loaded.propose(context, 4)] == [[4, 5]]
    assert [d.tokens.tolist() for d in original.propose(context, 4)] == [[4, 5]]
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left no temp file


def test_load_keeps_only_the_newest_tokens_that_fit(tmp_path):
    history = HistoryDrafter()
    for start in range(0, 100, 10):
        history.add(np.arange(start, start + 10))
    history.save(tmp_path / "h.npz")
    small = HistoryDrafter.load(tmp_path / "h.npz", max_tokens=20)
    assert small.size == 20
    assert small.propose(np.array([97, 98]), 1)[0].tokens.tolist() == [99]


def test_truncated_or_foreign_files_raise_corrupt_history_error(tmp_path):
    filled().save(tmp_path / "h.npz")
    data = (tmp_path / "h.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptHistoryError):
        HistoryDrafter.load(tmp_path / "cut.npz")
    np.savez(tmp_path / "floats.npz", tokens=np.zeros(4), format=np.int64(1), fingerprint=np.array(""))
    with pytest.raises(CorruptHistoryError):
        HistoryDrafter.load(tmp_path / "floats.npz")
    np.savez(tmp_path / "future.npz", tokens=np.zeros(4, np.int32), format=np.int64(99), fingerprint=np.array(""))
    with pytest.raises(CorruptHistoryError):
        HistoryDrafter.load(tmp_path / "future.npz")
    with pytest.raises(FileNotFoundError):
        HistoryDrafter.load(tmp_path / "missing.npz")


def test_ids_beyond_the_vocabulary_and_another_tokenizer_are_refused(tmp_path):
    words = word_tokenizer("a b c d e f g h i j".split())
    filled().save(tmp_path / "h.npz", tokenizer=words)
    with pytest.raises(TokenIdOutOfRangeError):
        HistoryDrafter.load(tmp_path / "h.npz", vocab_size=5)
    other = word_tokenizer("k l m n o p q r s t".split())
    with pytest.raises(TokenizerMismatchError):
        HistoryDrafter.load(tmp_path / "h.npz", tokenizer=other)
    assert HistoryDrafter.load(tmp_path / "h.npz", tokenizer=words).size == filled().size
