"""Where this library keeps files between processes: the one owner of that setting.

``$RETRIEVAL_DRAFT_CACHE`` when set, else ``$XDG_CACHE_HOME/retrieval-draft``
(an absolute ``XDG_CACHE_HOME`` only, as the XDG spec asks), else
``~/.cache/retrieval-draft``. It holds measured forward-cost curves
(``cost-curves/``), learned acceptance rates (``learned-rates/``), records of
verified datastores (``verified-stores/``), model files assembled from wheels
(``models/``: Gemma-3-270M, Qwen2.5-Coder-0.5B) and GGUF files' float32 conversions
(``gguf-converted/``, 4 bytes per parameter); deleting it costs a re-measurement, a re-verification and one slow
load per GGUF model, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CACHE_ENV = "RETRIEVAL_DRAFT_CACHE"


def cache_root() -> Path:
    """The directory for this library's cached files (not created here)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "retrieval-draft"


def cache_file(kind: str, key: str) -> Path:
    """The file for ``key`` (any text naming what it holds) in the ``kind`` folder of the cache."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    return cache_root() / kind / f"{digest}.json"


def write_cache_json(path: Path, body) -> None:
    """Write ``body`` as JSON to ``path`` atomically; an unwritable cache is skipped silently
    (it costs a re-measurement or re-verification in a later process, nothing else)."""
    from retrieval_draft.atomic import atomic_write_bytes

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(body).encode("utf-8"))
    except OSError:
        pass
