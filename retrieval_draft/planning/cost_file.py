"""Forward-cost curves kept on disk, so a new process does not measure again.

A curve depends on the model's shape, never its weights, and on where it
runs: the file is keyed by a hash of the model config (its name and path
left out), dtype, device, torch threads, CPU model and library versions.
It lives in the user's cache directory (``cache_dir.cache_root``), under
``cost-curves/<key>.json``. Writes are atomic; a corrupt, truncated
or foreign file is ignored (and replaced by the next measurement's).

A stored curve says when it was written and how (``origin``: measured, or lowered where decoding
proved it too dear), and ages: one older than ``MAX_AGE_S``, one from the future, or one outside
``cost.plausible`` is not used, and the next single-row call measures the curve again from its
own forwards (a few steps, which accept tokens too). ``retrieval-draft cache`` shows and resets it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from retrieval_draft.cache_dir import cache_file, write_cache_json
from retrieval_draft.planning.cost import VerifyCost, plausible

# Bump when the measurement or the decode path changes what a curve means.
COST_FILE_FORMAT = 7  # 2: spiked probes are timed again (``cost.spiked``); 3: the skinny kernel competes from 1 row;
# 4: and up to 64 rows; 5: sizes timed beside a lone root, with the time and origin of the measurement;
# 6: the kernel walks the weights row by row up to ``skinny_linear.ROW_BY_ROW`` rows (small trees cost less);
# 7: ... only where that is faster on the machine (``row_by_row``, measured with the curve)
MAX_AGE_S = 7 * 24 * 3600.0  # a curve older than a week is measured again (a machine's load, clocks and libraries move)
MEASURED, CORRECTED = "measured", "corrected"  # how a stored curve was made


def _cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cost_key(model: torch.nn.Module) -> dict:
    """Everything a measured curve depends on, as plain JSON values."""
    import transformers

    config = model.config.to_dict()
    config.pop("_name_or_path", None)
    config.pop("quantization_config", None)  # a GGUF file's record; the weights are float32 either way (dtype below)
    config_json = json.dumps(config, sort_keys=True, default=str)
    parameter = next(model.parameters())
    device = parameter.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model()
    return {
        "format": COST_FILE_FORMAT,
        "config_sha256": hashlib.sha256(config_json.encode("utf-8")).hexdigest(),
        "dtype": str(parameter.dtype),
        "device": f"{device.type}:{device_name}",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def cost_path(key: dict) -> Path:
    """Where the curve for ``key`` is kept."""
    return cache_file("cost-curves", json.dumps(key, sort_keys=True))


def read_cost(path: Path, key: dict, now: float | None = None) -> VerifyCost | None:
    """The curve stored at ``path`` for ``key``, or None if absent, damaged, for another key,
    stale (older than ``MAX_AGE_S`` or dated in the future) or implausible (``cost.plausible``)."""
    body = read_record(path)
    if body is None or body.get("key") != key:
        return None
    now = time.time() if now is None else now
    if not 0.0 <= now - body["measured_at"] <= MAX_AGE_S:
        return None
    cost = recorded_curve(body)
    return cost if plausible(cost, gpu=not str(key.get("device", "cpu")).startswith("cpu")) else None


def read_record(path: Path) -> dict | None:
    """The stored record at ``path`` with ``seconds`` as an array, ``skinny_sizes`` as a frozenset
    (or None) and ``row_by_row`` (False where a record has none), or None if absent or damaged; its
    age and plausibility are not judged here."""
    try:
        body = json.loads(path.read_bytes())
        seconds = np.asarray(body["seconds"], dtype=np.float64)
        skinny = body.get("skinny_sizes")
        measured_at = float(body["measured_at"])
        row_by_row = body.get("row_by_row", False)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if seconds.ndim != 1 or seconds.size < 2 or not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        return None
    if np.any(np.diff(seconds) < 0) or not np.isfinite(measured_at):
        return None
    if skinny is not None and not (isinstance(skinny, list) and all(isinstance(s, int) for s in skinny)):
        return None
    if not isinstance(row_by_row, bool):
        return None
    return {**body, "seconds": seconds, "skinny_sizes": None if skinny is None else frozenset(skinny),
            "measured_at": measured_at, "row_by_row": row_by_row}


def recorded_curve(record: dict) -> VerifyCost:
    """The curve a record from ``read_record`` holds (its age and plausibility not judged)."""
    return VerifyCost(record["seconds"], record["skinny_sizes"], row_by_row=record["row_by_row"])


def write_cost(path: Path, key: dict, cost: VerifyCost, origin: str = MEASURED) -> None:
    """Store ``cost`` for ``key`` atomically, dated now; an unwritable cache directory is skipped silently."""
    body = {
        "key": key,
        "seconds": cost.seconds.tolist(),
        "skinny_sizes": None if cost.skinny_sizes is None else sorted(cost.skinny_sizes),
        "row_by_row": cost.row_by_row,
        "measured_at": time.time(),
        "origin": origin,
    }
    write_cache_json(path, body)


def load_cost(model: torch.nn.Module) -> VerifyCost | None:
    """The model's cost curve from the disk cache, or None where none is stored for it."""
    key = cost_key(model)
    return read_cost(cost_path(key), key)


def store_cost(model: torch.nn.Module, cost: VerifyCost, origin: str = MEASURED) -> None:
    """Keep ``cost`` (measured, or ``CORRECTED`` by observed forward times) as ``model``'s curve on disk."""
    key = cost_key(model)
    write_cost(cost_path(key), key, cost, origin)
