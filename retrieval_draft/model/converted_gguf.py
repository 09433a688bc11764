"""GGUF models converted once: later loads read float32 safetensors instead of parsing the GGUF file.

transformers reads a GGUF file's metadata once for the config, once for the
tokenizer and once for the weights, item by item (SmolLM2-135M's 49k-token
vocabulary: about 4 s each on 2 CPU cores; Gemma-3-270M's 262k tokens: about
20 s each), and builds a tensor-name map per submodule (about 4 s): a 20-25 s load
for a 100 MB file, in every process. While a file is converted, those reads
share one parse, made through a plain view of the mapped file (4x faster), and
one name map (``one_parse``): first loads of 13 s (SmolLM2-135M) and 34 s
(Gemma-3-270M) on one thread. The first
load of a GGUF file keeps what transformers made of it, the float32 model
(config, generation config, safetensors) and the fast tokenizer, in
``<cache>/gguf-converted/<key>/model/`` and ``.../tokenizer/``; later loads
read those folders (about 1 s). ``key`` names the file by its resolved path,
size and modification time, so a replaced file is converted again.

Each part is saved into a temp folder beside its final name, fsynced, and
renamed into place, so a folder that exists is complete. Processes that load
the same file at once take turns (``conversion_turn``: an exclusive ``flock``
on a lock file beside the folder, released by the kernel if its holder dies):
one converts, the others wait and then read what it kept, instead of parsing
and converting the file again each (a server's workers, or a test run's, all
starting on a fresh machine). Should two copies still be made, the second
rename fails and that copy is dropped. An unwritable cache is skipped (the
next load parses the GGUF file again).
Disk: the float32 weights, 4 bytes per parameter (about 0.5 GB for
SmolLM2-135M, 1.1 GB for Gemma-3-270M); deleting the folder costs one slow load.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retrieval_draft.atomic import fsync_path, temp_dir_next_to
from retrieval_draft.cache_dir import cache_root

if TYPE_CHECKING:
    import torch

PARTS = ("model", "tokenizer")
LOCK_SUFFIX = ".lock"
CONVERSION_LOCK = threading.Lock()  # one conversion at a time in a process: ``one_parse`` swaps a name


@contextmanager
def one_parse(gguf: str):
    """Within the block, every ``gguf.GGUFReader(gguf)`` that transformers makes (config, tokenizer,
    weights: it imports the class at each call) is one reader, parsed once (``_plain_reader``: 4x
    faster than gguf's own); other files get their own. transformers also builds
    ``gguf.get_tensor_name_map(arch, n_blocks)`` afresh for every submodule it maps (397 times for
    SmolLM2-135M, ~10 ms each); within the block each (arch, n_blocks) is built once. Both objects are only read after they are built (a read-only
    memory map, a name table), so sharing them changes nothing that is loaded
    (``tests/plugin/test_real_model.py`` compares a kept copy with transformers' own load).
    Holds ``CONVERSION_LOCK``; both names are put back on the way out."""
    import gguf as gguf_package

    target = os.path.realpath(gguf)
    with CONVERSION_LOCK:
        reader_class, name_map = gguf_package.GGUFReader, gguf_package.get_tensor_name_map
        parsed = None

        def reader(path, *args, **kwargs):
            nonlocal parsed
            if args or kwargs or os.path.realpath(path) != target:
                return reader_class(path, *args, **kwargs)
            if parsed is None:
                parsed = _plain_reader(reader_class)(path)
            return parsed

        gguf_package.GGUFReader, gguf_package.get_tensor_name_map = reader, functools.cache(name_map)
        try:
            yield
        finally:
            gguf_package.GGUFReader, gguf_package.get_tensor_name_map = reader_class, name_map


def _plain_reader(reader_class: type) -> type:
    """``reader_class`` (gguf's ``GGUFReader``) reading through a plain ndarray view of its memory map.

    The reader slices its ``np.memmap`` once per metadata item and per token of the vocabulary, and
    each slice of a memmap runs numpy's Python-level ``memmap.__getitem__`` / ``__array_finalize__``;
    a plain view of the same mapped bytes slices in C. Parsing Gemma-3-270M's file: 22 s -> 5.7 s,
    SmolLM2-135M's: 3.5 s -> 1.6 s; every field and tensor compares equal (the mapping is read-only
    either way, and the view keeps it open)."""

    class PlainArrayReader(reader_class):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._plain = np.asarray(mapped)

    return PlainArrayReader


@contextmanager
def conversion_turn(gguf: str):
    """This process's turn to convert ``gguf``: holds an exclusive ``flock`` on
    ``<cache>/gguf-converted/<key>.lock`` for the block, waiting while another process (or
    thread) holds it. Without a writable cache, or where ``fcntl`` is missing, the block runs
    without a lock (two copies may then be made, and the second is dropped)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    folder = _key_folder(gguf)
    handle = None
    if fcntl is not None and folder is not None:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            handle = os.open(str(folder) + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            if handle is not None:
                os.close(handle)
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            os.close(handle)  # releases the lock


def converted_part(gguf: str, part: str) -> Path | None:
    """The complete saved ``part`` (one of ``PARTS``) of GGUF file ``gguf``, or None if not kept yet."""
    folder = _folder(gguf, part)
    return folder if folder is not None and folder.is_dir() else None


def keep_part(gguf: str, part: str, loaded) -> None:
    """Save ``loaded`` (a model or tokenizer just loaded from ``gguf``, with ``save_pretrained``)
    as ``part``, atomically; does nothing when the part exists or the cache cannot be written."""
    final = _folder(gguf, part)
    if final is None or final.exists():
        return
    staging = None
    try:
        staging = temp_dir_next_to(final)
        import torch  # here: the module imports without torch (the command line checks a model path first)

        if isinstance(loaded, torch.nn.Module):
            _save_model(loaded, staging)
        else:
            loaded.save_pretrained(staging)
        for file in staging.iterdir():
            fsync_path(file)
        os.rename(staging, final)  # fails when another process kept this part first
        fsync_path(final.parent)
    except OSError:
        pass
    finally:
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _save_model(model: torch.nn.Module, folder: Path) -> None:
    """Write ``model`` (dequantised from GGUF) as a plain float32 checkpoint: its config less the
    GGUF quantisation record (which makes ``save_pretrained`` refuse), its generation config, and
    its weights as safetensors (tied matrices stored once)."""
    from safetensors.torch import save_model

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _folder(gguf: str, part: str) -> Path | None:
    """Where ``part`` of ``gguf`` is kept (None when the file cannot be read)."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    folder = _key_folder(gguf)
    return None if folder is None else folder / part


def _key_folder(gguf: str) -> Path | None:
    """``<cache>/gguf-converted/<key>``, the folder of ``gguf``'s kept parts (None when the file
    cannot be read): the key hashes the file's resolved path, size and modification time."""
    try:
        status = os.stat(gguf)
    except OSError:
        return None
    key = f"{os.path.realpath(gguf)}|{status.st_size}|{status.st_mtime_ns}"
    return cache_root() / "gguf-converted" / hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
