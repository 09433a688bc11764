"""Learned acceptance rates kept on disk, so a new process starts where the last one stopped.

The rates (``AcceptanceCalibrator`` counts per drafter, greedy and sampling
apart) describe how often a model accepts each drafter's guesses; they change
tree sizes, never outputs. A fresh process otherwise starts from the priors,
which on chat prompts trust long prompt-lookup chains too much for the first
few dozen steps. The file sits in the user cache directory
(``cache_dir.cache_root``) under ``learned-rates/<model key>.json``, keyed by
the model config (its name or path included: a fine-tune accepts differently);
written atomically at most every ``SAVE_INTERVAL_S`` seconds; a damaged or
foreign file is ignored.

Stored rates are a head start, not a verdict: read back, each cell's counts are scaled down to at
most ``STORED_TRIALS`` trials (its rate kept), so a new process's own steps outweigh them within
a few dozen steps. Rates learned in one workload, or planted wrong (a file saying no draft is ever
accepted), cannot hold a later process's trees small for long: drafts are graded even when the
planner prunes them, so the process keeps learning while it plans lone roots.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from retrieval_draft.cache_dir import cache_file, write_cache_json
from retrieval_draft.planning.calibration import AcceptanceCalibrator

RATES_FILE_FORMAT = 1
SAVE_INTERVAL_S = 30.0
STORED_TRIALS = 16.0  # most trials a stored cell counts for when read back (four times the calibrator's prior weight)

Rates = dict[bool, dict[str, AcceptanceCalibrator]]


def rates_path(model: torch.nn.Module) -> Path:
    """Where ``model``'s rates are kept (a GGUF file's quantisation record left out: its load and
    the kept float32 copy of it, ``model.converted_gguf``, are one model under one name)."""
    body = model.config.to_dict()
    body.pop("quantization_config", None)
    config = json.dumps(body, sort_keys=True, default=str)
    return cache_file("learned-rates", f"{RATES_FILE_FORMAT}:{config}")


def _calibrator(body: dict) -> AcceptanceCalibrator:
    calibrator = AcceptanceCalibrator(prior_scale=float(body["prior_scale"]))
    hits, trials = np.asarray(body["hits"], np.float64), np.asarray(body["trials"], np.float64)
    if hits.shape != calibrator.hits.shape or trials.shape != calibrator.trials.shape:
        raise ValueError("calibrator shape differs")
    if not (np.all(np.isfinite(trials)) and np.all(hits >= 0) and np.all(hits <= trials + 1e-9)):
        raise ValueError("counts out of range")
    scale = np.minimum(1.0, STORED_TRIALS / np.maximum(trials, 1e-12))  # each cell's rate kept, its weight capped
    calibrator.hits, calibrator.trials = hits * scale, trials * scale
    return calibrator


def read_rates(path: Path) -> Rates | None:
    """The rates stored at ``path``, or None when absent or damaged."""
    try:
        body = json.loads(path.read_bytes())
        if body.get("format") != RATES_FILE_FORMAT:
            return None
        return {
            sampling: {name: _calibrator(c) for name, c in body[key].items()}
            for sampling, key in ((False, "greedy"), (True, "sampling"))
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def write_rates(path: Path, rates: Rates) -> None:
    """Store ``rates`` atomically; an unwritable cache directory is skipped silently."""
    def plain(calibrators: dict[str, AcceptanceCalibrator]) -> dict:
        return {
            name: {"prior_scale": c.prior_scale, "hits": c.hits.tolist(), "trials": c.trials.tolist()}
            for name, c in list(calibrators.items())
        }

    body = {"format": RATES_FILE_FORMAT, "greedy": plain(rates[False]), "sampling": plain(rates[True])}
    write_cache_json(path, body)
