"""A GGUF file's converted parts are kept whole or not at all, once, under the file's own key."""

import os
import threading

import numpy as np
import pytest

from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.model.converted_gguf import conversion_turn, converted_part, keep_part


class _Saves:
    """Stands in for a tokenizer: ``save_pretrained`` writes one file (or fails half-way)."""

    def __init__(self, text: str, fail: bool = False) -> None:
        self.text, self.fail = text, fail

    def save_pretrained(self, folder) -> None:
        (folder / "tokenizer.json").write_text(self.text)
        if self.fail:
            raise OSError("disk full")


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return str(path)


def test_a_part_is_kept_once_and_found_again(gguf):
    assert converted_part(gguf, "tokenizer") is None
    keep_part(gguf, "tokenizer", _Saves("first"))
    kept = converted_part(gguf, "tokenizer")
    assert kept is not None and (kept / "tokenizer.json").read_text() == "first"
    keep_part(gguf, "tokenizer", _Saves("second"))  # a second process's copy does not replace it
    assert (kept / "tokenizer.json").read_text() == "first"
    assert converted_part(gguf, "model") is None


def test_a_failed_save_leaves_nothing_behind(gguf, tmp_path):
    keep_part(gguf, "tokenizer", _Saves("half", fail=True))
    assert converted_part(gguf, "tokenizer") is None
    assert not [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]


def test_a_changed_file_is_converted_again(gguf):
    keep_part(gguf, "tokenizer", _Saves("old"))
    with open(gguf, "ab") as handle:
        handle.write(b"more")
    assert converted_part(gguf, "tokenizer") is None


def test_an_unwritable_cache_is_skipped(gguf, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    keep_part(gguf, "tokenizer", _Saves("x"))
    assert converted_part(gguf, "tokenizer") is None


def test_an_unknown_part_is_refused(gguf):
    with pytest.raises(ValueError, match="part must be one of"):
        converted_part(gguf, "weights")
    assert os.path.exists(gguf)


def _tiny_gguf(path) -> str:
    """A valid GGUF file holding one metadata string and one tensor."""
    import gguf as gguf_package

    writer = gguf_package.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "tiny")
    writer.add_tensor("weight", np.arange(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_one_parse_gives_every_reader_of_the_file_the_same_parse_and_puts_the_names_back(tmp_path):
    import gguf as gguf_package

    from retrieval_draft.model.converted_gguf import one_parse

    file, other = _tiny_gguf(tmp_path / "a.gguf"), _tiny_gguf(tmp_path / "b.gguf")
    reader_class, name_map = gguf_package.GGUFReader, gguf_package.get_tensor_name_map
    llama = gguf_package.MODEL_ARCH.LLAMA
    with one_parse(file):
        first = gguf_package.GGUFReader(file)
        assert gguf_package.GGUFReader(os.path.relpath(file)) is first  # the same file by another name
        assert gguf_package.GGUFReader(other) is not first
        assert first.fields["general.name"].contents() == "tiny"
        own = reader_class(file)  # gguf's reader over its memmap; the shared one reads a plain view
        assert type(first.data) is np.ndarray and isinstance(own.data, np.memmap)
        assert first.fields.keys() == own.fields.keys()
        assert all(np.array_equal(a, b) for key in own.fields for a, b in zip(first.fields[key].parts, own.fields[key].parts))
        assert [t.name for t in first.tensors] == [t.name for t in own.tensors]
        assert all(np.array_equal(a.data, b.data) for a, b in zip(first.tensors, own.tensors))
        table = gguf_package.get_tensor_name_map(llama, 2)
        assert gguf_package.get_tensor_name_map(llama, 2) is table
        assert gguf_package.get_tensor_name_map(llama, 3) is not table
        assert table.mapping == name_map(llama, 2).mapping
    assert (gguf_package.GGUFReader, gguf_package.get_tensor_name_map) == (reader_class, name_map)
    with pytest.raises(RuntimeError), one_parse(file):
        raise RuntimeError("a failed load")
    assert (gguf_package.GGUFReader, gguf_package.get_tensor_name_map) == (reader_class, name_map)


def test_a_second_loader_waits_for_the_first_conversion_then_finds_it_kept(gguf):
    """Two loaders of one file (threads here: each opens the lock file itself, so ``flock`` treats
    them as two processes): the second enters its turn only after the first has kept the part."""
    seen = []

    def second() -> None:
        with conversion_turn(gguf):
            seen.append(converted_part(gguf, "tokenizer"))

    with conversion_turn(gguf):
        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and seen == []  # it waits while the first converts
        keep_part(gguf, "tokenizer", _Saves("first"))
    waiting.join(10)
    assert not waiting.is_alive() and seen == [converted_part(gguf, "tokenizer")] and seen[0] is not None


def test_an_unreadable_file_or_unwritable_cache_takes_its_turn_without_a_lock(gguf, tmp_path, monkeypatch):
    with conversion_turn(str(tmp_path / "missing.gguf")):
        pass
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    with conversion_turn(gguf):
        with conversion_turn(gguf):  # no lock taken, so no wait
            pass
