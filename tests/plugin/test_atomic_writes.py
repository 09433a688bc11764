"""Atomic writes leave complete files with the permissions a plain write would give."""

import os
import stat

import pytest

from retrieval_draft.atomic import atomic_path, atomic_write_bytes, swap_into_place, temp_dir_next_to


@pytest.fixture
def umask():
    """Run under umask 022 and return it (restored afterwards)."""
    previous = os.umask(0o022)
    yield 0o022
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_atomic_file_is_as_readable_as_a_plain_one(tmp_path, umask):
    atomic_write_bytes(tmp_path / "result.json", b"{}\n")
    (tmp_path / "plain.json").write_bytes(b"{}\n")
    assert (tmp_path / "result.json").read_bytes() == b"{}\n"
    assert mode(tmp_path / "result.json") == mode(tmp_path / "plain.json") == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "result.json"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_swapped_in_directory_is_as_readable_as_a_plain_one(tmp_path, umask):
    out = tmp_path / "store"
    out.mkdir()
    (out / "old").write_bytes(b"1")
    building = temp_dir_next_to(out)
    (building / "new").write_bytes(b"2")
    swap_into_place(building, out)
    assert sorted(p.name for p in out.iterdir()) == ["new"]
    assert mode(out) == 0o777 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
