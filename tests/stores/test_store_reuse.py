"""`datastore=PATH` opens and verifies a store once per process and build, and notices a rebuild."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.errors import CorruptDatastoreError, DatastoreNotFoundError, TokenizerMismatchError
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.store.layout import TOKENS
from retrieval_draft_datastore.builder import build
from tests.conftest import make_tiny_llama
from tests.datastore_fixtures import word_tokenizer

WORDS = "a b c d e f x y z q".split()


def _build(root, docs, out):
    for i, doc in enumerate(docs):
        (root / f"{i}.txt").write_text(doc)
    build([str(root / f"{i}.txt") for i in range(len(docs))], out, word_tokenizer(WORDS), progress=False)
    return out


@pytest.fixture()
def store_path(tmp_path):
    return _build(tmp_path, ["a b c d e a b c d e", "a b c d f z"], tmp_path / "ds")


def _count_opens(monkeypatch) -> list:
    import retrieval_draft.store.opening

    opened = []
    real = retrieval_draft.store.opening.open_datastore

    def counting(path, **kwargs):
        opened.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(retrieval_draft.store.opening, "open_datastore", counting)
    return opened


def test_a_store_is_opened_once_for_many_calls(store_path, monkeypatch):
    opened = _count_opens(monkeypatch)
    memory = PluginMemory()
    first = memory.stores.open(store_path)
    assert memory.stores.open(str(store_path)) is first
    assert memory.stores.open(store_path / ".") is first
    assert len(opened) == 1


def test_the_plugin_reuses_the_store_across_generate_calls(store_path, monkeypatch):
    opened = _count_opens(monkeypatch)
    model = make_tiny_llama(seed=21, vocab_size=len(word_tokenizer(WORDS)) + 4)
    memory = PluginMemory()
    prompt = torch.tensor([[1, 2, 3, 4]])
    outs = [
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                       custom_generate=retrieval_draft.generate, datastore=str(store_path), draft_memory=memory)
        for _ in range(3)
    ]
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert all(torch.equal(out, expected) for out in outs)
    assert len(opened) == 1


def test_a_rebuild_at_the_same_path_is_reopened_and_the_old_store_stays_readable(tmp_path, store_path):
    memory = PluginMemory()
    old = memory.stores.open(store_path)
    old_tokens = np.array(old.tokens).copy()
    (tmp_path / "second").mkdir()
    _build(tmp_path / "second", ["x y z q x y z q x y z q"], store_path)
    new = memory.stores.open(store_path)
    assert new is not old
    assert new.tokens.size != old_tokens.size
    assert np.array_equal(np.array(old.tokens), old_tokens)  # the held store still reads its own files


def test_a_file_changed_in_place_is_verified_again(store_path):
    memory = PluginMemory()
    memory.stores.open(store_path)
    target = store_path / TOKENS
    data = bytearray(target.read_bytes())
    data[-20] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(CorruptDatastoreError, match="sha256 mismatch"):
        memory.stores.open(store_path)


def test_an_opened_store_can_be_passed_as_datastore(store_path):
    store = retrieval_draft.open_datastore(store_path)
    assert retrieval_draft.open_datastore(store_path) is store
    model = make_tiny_llama(seed=22, vocab_size=len(word_tokenizer(WORDS)) + 4)
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False,
                         custom_generate=retrieval_draft.generate, datastore=store)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10, do_sample=False)
    assert torch.equal(got, expected)


def test_a_cached_store_still_refuses_another_tokenizer(store_path):
    model = make_tiny_llama(seed=23, vocab_size=64)
    memory = PluginMemory()
    memory.stores.open(store_path)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(TokenizerMismatchError):
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                       custom_generate=retrieval_draft.generate, datastore=store_path,
                       draft_tokenizer=word_tokenizer(WORDS + ["extra"]), draft_memory=memory)


def test_a_missing_store_is_a_typed_error(tmp_path):
    with pytest.raises(DatastoreNotFoundError, match="no datastore at .*nothing-here: the path does not exist"):
        PluginMemory().stores.open(tmp_path / "nothing-here")


def _record_verify_flags(monkeypatch) -> list:
    import retrieval_draft.store.opening

    opened = []
    real = retrieval_draft.store.opening.open_datastore
    monkeypatch.setattr(retrieval_draft.store.opening, "open_datastore",
                        lambda path, **kw: opened.append(kw.get("verify", True)) or real(path, **kw))
    return opened


def test_a_new_process_trusts_a_recorded_verification_of_the_same_files(store_path, monkeypatch):
    import os

    from retrieval_draft.cache_dir import cache_file

    # As for a store copied from another machine: no record of it. Only this store's record goes (the
    # run's cache is shared by the xdist workers, which write their own records meanwhile).
    os.remove(cache_file("verified-stores", os.path.realpath(store_path)))
    opened = _record_verify_flags(monkeypatch)
    PluginMemory().stores.open(store_path)  # first process: full verification, recorded
    PluginMemory().stores.open(store_path)  # a later process (a fresh memory): the record is trusted
    assert opened == [True, False]


def test_the_first_open_after_a_build_needs_no_rehashing(store_path, monkeypatch):
    opened = _record_verify_flags(monkeypatch)
    PluginMemory().stores.open(store_path)  # the builder recorded the files it wrote
    assert opened == [False]


def test_a_file_edited_with_its_mtime_set_back_is_verified_again(store_path):
    import os

    PluginMemory().stores.open(store_path)
    target = store_path / TOKENS
    before = target.stat()
    data = bytearray(target.read_bytes())
    data[-20] ^= 0xFF
    with open(target, "r+b") as handle:  # same inode, same size
        handle.write(bytes(data))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(CorruptDatastoreError, match="sha256 mismatch"):
        PluginMemory().stores.open(store_path)
