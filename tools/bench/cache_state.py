"""Which user cache a benchmark run plans from, stated in its report: fresh or lived-in.

``--cache fresh`` gives the run a cache folder of its own with no planning records (no cost curve,
no learned rates: the first call measures and learns), linking the user's kept models and GGUF
conversions into it so that loading stays as fast as a user's (the folder is deleted when the run ends); ``--cache user`` (the default) plans
from the user's cache as it is, whatever earlier runs left there. Either way the report says what
the cache held for the model when the run began (``planning_records``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from retrieval_draft.cache_dir import CACHE_ENV, cache_root

CACHE_MODES = ("user", "fresh")
KEPT_FOLDERS = ("models", "gguf-converted", "verified-stores")  # linked into a fresh cache: not planning records


@contextlib.contextmanager
def fresh_cache() -> Iterator[Path]:
    """For the body of a ``with``, point this process (and the processes it starts) at a new cache
    folder without planning records, the user's kept models, conversions and store verifications
    linked in; afterwards the folder (its links, not what they point to) is deleted and the cache
    setting restored."""
    before, user = os.environ.get(CACHE_ENV), cache_root()
    fresh = Path(tempfile.mkdtemp(prefix="retrieval-draft-bench-cache-"))
    try:
        for name in KEPT_FOLDERS:
            if (user / name).is_dir():
                (fresh / name).symlink_to(user / name, target_is_directory=True)
        os.environ[CACHE_ENV] = str(fresh)
        yield fresh
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before
        shutil.rmtree(fresh, ignore_errors=True)


def planning_records(model, mode: str) -> dict:
    """What the cache holds for ``model`` now: its cost curve (age in hours, origin, whether it is
    used) and whether learned rates are stored."""
    from retrieval_draft.planning.cost_file import cost_key, cost_path, read_cost, read_record
    from retrieval_draft.planning.rates_file import rates_path

    key = cost_key(model)
    record = read_record(cost_path(key))
    state = {"mode": mode, "folder": str(cache_root()), "rates_stored": rates_path(model).exists(), "curve": None}
    if record is not None:
        state["curve"] = {
            "age_h": round((time.time() - record["measured_at"]) / 3600, 2),
            "origin": record.get("origin"),
            "used": read_cost(cost_path(key), key) is not None,
        }
    return state


def describe(state: dict | None) -> str:
    """One line for the report."""
    if state is None:
        return "user cache: not recorded"
    curve = state["curve"]
    if state["mode"] == "fresh":
        head = "user cache: fresh (a folder of its own, no planning records: the first call measures the cost curve)"
    elif curve is None and not state["rates_stored"]:
        head = "user cache: the user's, holding no planning records for this model (the first call measures the cost curve)"
    else:
        held = f"a cost curve {curve['origin']} {curve['age_h']} h before ({'used' if curve['used'] else 'not used: measured again'})" if curve else "no cost curve"
        head = f"user cache: lived-in (the user's, as earlier runs left it: {held}; learned rates {'stored' if state['rates_stored'] else 'none'})"
    return head
