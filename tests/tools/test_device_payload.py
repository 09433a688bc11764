"""tools.device_payload: a file cut into parts that calls carry comes back whole, or not at all."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.device_payload import PayloadError, assemble, main, pack


def _file(tmp_path, size: int = 10_000):
    data = bytes((i * 7919) % 251 for i in range(size))
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    return path, data


def _gguf_package(tmp_path):
    package = tmp_path / "gguf_src"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    return package


def test_parts_carried_into_other_folders_join_to_the_same_file(tmp_path):
    source, data = _file(tmp_path)
    folders = pack(source, tmp_path / "payload", part_bytes=3_000, gguf_dir=_gguf_package(tmp_path))
    assert [f.name for f in folders] == ["part1", "part2", "part3", "part4"]
    assert all(sum(p.stat().st_size for p in f.glob("piece-*")) <= 3_000 for f in folders)
    # each call lands its part somewhere of its own; the folders come in any order
    landed = []
    for folder in reversed(folders):
        copy = tmp_path / "device" / f"call-{len(landed)}"
        shutil.copytree(folder, copy)
        landed.append(copy)
    joined = assemble(landed, tmp_path / "model")
    assert joined.read_bytes() == data and joined.name == "model.gguf"
    assert (tmp_path / "model" / "site" / "gguf" / "__init__.py").read_text() == "VALUE = 1\n"


def test_a_missing_or_altered_piece_is_refused_and_no_file_appears(tmp_path):
    source, _ = _file(tmp_path)
    folders = pack(source, tmp_path / "payload", part_bytes=4_000, gguf_dir=None)
    with pytest.raises(PayloadError, match="piece-03.bin"):
        assemble(folders[:2], tmp_path / "out")
    piece = folders[1] / "piece-02.bin"
    altered = bytearray(piece.read_bytes())
    altered[10] ^= 1
    piece.write_bytes(bytes(altered))
    with pytest.raises(PayloadError, match="SHA-256"):
        assemble(folders, tmp_path / "out")
    assert not (tmp_path / "out" / "model.gguf").exists() and not list((tmp_path / "out").glob("*.partial"))


def test_the_command_packs_the_default_model_under_a_calls_limit(tmp_path, capsys):
    """The documented ``pack`` on SmolLM2-135M's GGUF: each part beside the checkout's tracked files
    fits a call (64 MiB), gguf rides in part1, and ``assemble`` gives back the file's exact bytes."""
    from retrieval_draft.model.models import default_model_path

    repo = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    tree = sum((repo / name).stat().st_size for name in listed.decode().split("\0") if name and (repo / name).is_file())
    out = tmp_path / "payload"
    assert main(["pack", "--out", str(out)]) == 0
    parts = sorted(out.iterdir())
    sizes = [sum(p.stat().st_size for p in part.rglob("*") if p.is_file()) for part in parts]
    assert len(parts) >= 2 and all(tree + size <= 64 * 2**20 for size in sizes), (tree, sizes)
    assert (parts[0] / "gguf" / "__init__.py").is_file()
    assert main(["assemble", *map(str, parts), "--to", str(tmp_path / "model")]) == 0
    joined = capsys.readouterr().out.strip().splitlines()[-1]
    original = default_model_path()
    digest = lambda path: hashlib.sha256(open(path, "rb").read()).hexdigest()  # noqa: E731
    assert digest(joined) == digest(original)
    assert main(["assemble", str(parts[0]), "--to", str(tmp_path / "again")]) == 2  # one part alone: refused
