"""Forward-cost curves kept on disk, so a new process does not measure again.

A curve depends on the model's shape, never its weights, and on where it
runs: the file is keyed by a hash of the model config (its name and path
left out), dtype, device, torch threads, CPU model and library versions.
It lives in the user's cache directory (``cache_dir.cache_root``), under
``cost-curves/<key>.json``. Writes are atomic; a corrupt, truncated
or foreign file is ignored (and replaced by the next measurement's).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np
import torch

from retrieval_draft.cache_dir import cache_file, write_cache_json
from retrieval_draft.planning.cost import VerifyCost

# Bump when the measurement or the decode path changes what a curve means.
COST_FILE_FORMAT = 4  # 2: spiked probes are timed again (``cost.spiked``); 3: the skinny kernel competes from 1 row;
# 4: and up to 64 rows


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


def read_cost(path: Path, key: dict) -> VerifyCost | None:
    """The curve stored at ``path`` for ``key``, or None if absent, damaged or for another key."""
    try:
        body = json.loads(path.read_bytes())
        if body.get("key") != key:
            return None
        seconds = np.asarray(body["seconds"], dtype=np.float64)
        skinny = body.get("skinny_sizes")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if seconds.ndim != 1 or seconds.size < 2 or not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        return None
    if np.any(np.diff(seconds) < 0):
        return None
    if skinny is not None and not (isinstance(skinny, list) and all(isinstance(s, int) for s in skinny)):
        return None
    return VerifyCost(seconds, None if skinny is None else frozenset(skinny))


def write_cost(path: Path, key: dict, cost: VerifyCost) -> None:
    """Store ``cost`` for ``key`` atomically; an unwritable cache directory is skipped silently."""
    body = {
        "key": key,
        "seconds": cost.seconds.tolist(),
        "skinny_sizes": None if cost.skinny_sizes is None else sorted(cost.skinny_sizes),
    }
    write_cache_json(path, body)


def load_cost(model: torch.nn.Module) -> VerifyCost | None:
    """The model's cost curve from the disk cache, or None where none is stored for it."""
    key = cost_key(model)
    return read_cost(cost_path(key), key)


def store_cost(model: torch.nn.Module, cost: VerifyCost) -> None:
    """Keep ``cost`` (e.g. corrected by observed forward times) as ``model``'s curve on disk."""
    key = cost_key(model)
    write_cost(cost_path(key), key, cost)
