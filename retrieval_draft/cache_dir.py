"""Where this library keeps files between processes: the one owner of that setting.

``$RETRIEVAL_DRAFT_CACHE`` when set, else ``$XDG_CACHE_HOME/retrieval-draft``
(an absolute ``XDG_CACHE_HOME`` only, as the XDG spec asks), else
``~/.cache/retrieval-draft``. It holds measured forward-cost curves
(``cost-curves/``) and records of verified datastores (``verified-stores/``);
deleting it costs a re-measurement and a re-verification, nothing else.
"""

from __future__ import annotations

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
