"""The file format the learning drafters share: named arrays in an .npz with a format number
and the writing tokenizer's fingerprint.

``save_tagged`` writes atomically (temp file, fsync, rename); ``load_tagged``
turns every way the file can be unreadable into the caller's one typed
error, then checks the format number and the tokenizer. What the arrays
must hold is the caller's to check.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from retrieval_draft.errors import TokenizerMismatchError


def save_tagged(path: str | Path, arrays: dict[str, np.ndarray], version: int, tokenizer=None) -> None:
    """Write ``arrays`` plus ``format`` = version and the tokenizer's fingerprint ("" without one)."""
    from retrieval_draft.atomic import atomic_path
    from retrieval_draft.store.tokenizer import tokenizer_fingerprint

    fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else ""
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **arrays, format=np.int64(version), fingerprint=np.array(fingerprint))


def load_tagged(path: str | Path, names: tuple[str, ...], version: int, error: type[Exception], what: str,
                tokenizer=None) -> dict[str, np.ndarray]:
    """The arrays ``names`` of the file at ``path``.

    Raises FileNotFoundError; ``error`` for an unreadable file, a missing array or
    another format number (``what`` names the file's kind in the message);
    TokenizerMismatchError when ``tokenizer`` differs from the one recorded.
    """
    from retrieval_draft.store.tokenizer import tokenizer_fingerprint

    if Path(path).is_file() and not zipfile.is_zipfile(path):  # np.load would try it as a pickle
        raise error(f"{path} is not a readable {what} (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in names}
            found, fingerprint = int(data["format"]), str(data["fingerprint"])
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise error(f"{path} is not a readable {what} ({exc})") from exc
    if found != version:
        raise error(f"{path} has {what} format {found}; this version reads {version}")
    if tokenizer is not None and fingerprint and fingerprint != tokenizer_fingerprint(tokenizer):
        raise TokenizerMismatchError(f"{path} was written with a different tokenizer")
    return arrays
