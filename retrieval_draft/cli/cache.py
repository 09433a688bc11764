"""``retrieval-draft cache``: what the user cache holds for planning, what it would plan, and a reset.

    retrieval-draft cache                    every stored cost curve and learned-rates file
    retrieval-draft cache --model M          that model's curve and rates (loads the model)
    retrieval-draft cache --reset [--model M]  forget them (all, or that model's); the next call measures again

A stored curve is shown with its age, how it was made, its price of a few tree sizes in lone roots
(one forward over one new token), whether it is plausible (``planning.cost.plausible``: a curve
outside the limit is not used) and the tree it would have the planner verify for a chain of drafts
accepted at a few rates. Nothing here changes what is generated.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from retrieval_draft.cache_dir import cache_root

SHOWN_SIZES = (2, 4, 8, 16, 32)  # tree sizes (new tokens) whose price is shown in lone roots
CHAIN_RATES = (0.5, 0.8, 0.95)  # per-token acceptance of the example chains whose planned width is shown


def add_cache(sub) -> None:
    """Register the ``cache`` subcommand on an argparse subparsers object."""
    cache = sub.add_parser("cache", help="show or reset the cost curves and learned rates kept in the user cache")
    cache.add_argument("--model", default=None, help="only this model's records (local HF directory, .gguf file or "
                       "a wheel-shipped name such as smollm2-135m; loads the model)")
    cache.add_argument("--reset", action="store_true", help="delete the records (the next call measures and learns afresh)")
    cache.set_defaults(func=run_cache)


def run_cache(args: argparse.Namespace) -> int:
    """Print the report, or reset, for every model or the one ``--model`` names."""
    paths = model_paths(args.model) if args.model is not None else None
    if args.reset:
        removed = reset(paths)
        print(f"removed {len(removed)} file(s) from {cache_root()}")
        return 0
    print(report(paths))
    return 0


def model_paths(location: str) -> list[Path]:
    """The cost-curve and learned-rates files of the model at ``location`` (loaded to compute their keys)."""
    from retrieval_draft.model.models import load_model
    from retrieval_draft.planning.cost_file import cost_key, cost_path
    from retrieval_draft.planning.rates_file import rates_path

    model = load_model(location)
    return [cost_path(cost_key(model)), rates_path(model)]


def stored_files(paths: list[Path] | None = None) -> list[Path]:
    """The cost-curve and learned-rates files in the cache (only ``paths`` among them, when given)."""
    found = sorted((cache_root() / "cost-curves").glob("*.json")) + sorted((cache_root() / "learned-rates").glob("*.json"))
    if paths is None:
        return found
    wanted = set(paths)
    return [path for path in found if path in wanted]


def reset(paths: list[Path] | None = None) -> list[Path]:
    """Delete the stored curves and rates (only ``paths`` among them, when given); the removed files."""
    removed = stored_files(paths)
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def report(paths: list[Path] | None = None, now: float | None = None) -> str:
    """One block per stored file: a curve's key, age, prices and plans, or a rates file's drafters."""
    now = time.time() if now is None else now
    files = stored_files(paths)
    if not files:
        return f"nothing stored in {cache_root()} (the next call measures the cost curve and learns rates afresh)"
    blocks = [describe_curve(path, now) if path.parent.name == "cost-curves" else describe_rates(path) for path in files]
    return "\n\n".join(blocks)


def describe_curve(path: Path, now: float) -> str:
    """A stored cost curve: what it is for, whether it is used, its prices and the trees it would plan."""
    from retrieval_draft.planning.cost import implausible_sizes
    from retrieval_draft.planning.cost_file import MAX_AGE_S, read_record, recorded_curve

    record = read_record(path)
    if record is None:
        return f"cost curve {path.name}: unreadable or of an older format (not used; measured again)"
    key = record.get("key", {})
    gpu = not str(key.get("device", "cpu")).startswith("cpu")
    cost = recorded_curve(record)
    age = now - record["measured_at"]
    wrong = implausible_sizes(cost, gpu)
    used = "used" if 0 <= age <= MAX_AGE_S and not wrong.size else "NOT used (measured again at the next call)"
    lone = float(cost.seconds[1])
    prices = ", ".join(f"{k}: {cost.seconds[min(k, cost.max_nodes)] / lone:.2f}" for k in SHOWN_SIZES)
    lines = [
        f"cost curve {path.name}: {key.get('device', '?')}, {key.get('dtype', '?')}, {key.get('threads', '?')} threads, "
        f"config {str(key.get('config_sha256', '?'))[:12]}",
        f"  {record.get('origin', '?')} {age / 3600:.1f} h ago; {used}",
        f"  lone root {1000 * lone:.1f} ms; in lone roots {prices}",
        f"  plausible: {'yes' if not wrong.size else f'no, too dear at {_sizes(wrong)} tokens'}",
        f"  matmul kernel at sizes: {_sizes(np.array(sorted(cost.skinny_sizes))) if cost.skinny_sizes else 'none'}"
        f"{', walking the weights row by row for few rows' if cost.row_by_row and cost.skinny_sizes else ''}",
        "  would verify: " + ", ".join(f"{planned_nodes(cost, p)} nodes for a chain accepted at {p}" for p in CHAIN_RATES),
    ]
    return "\n".join(lines)


def planned_nodes(cost, rate: float, budget: int = 32) -> int:
    """Draft nodes a planner with ``cost`` verifies for one row's chain of ``budget`` drafts, each
    accepted at ``rate`` given the ones before it."""
    from retrieval_draft.planning.planner import TreePlanner

    return TreePlanner(tree_budget=budget, cost=cost).width([rate ** np.arange(1, budget + 1)])


def describe_rates(path: Path) -> str:
    """A learned-rates file: per drafter, the greedy acceptance it learned and the trials behind it."""
    try:
        body = json.loads(path.read_bytes())
        greedy = body["greedy"]
        lines = [f"learned rates {path.name}:"]
        for name, counts in sorted(greedy.items()):
            hits, trials = np.asarray(counts["hits"], float).sum(), np.asarray(counts["trials"], float).sum()
            if trials < 0.5:  # counts decay each step, so a few trials long ago round to none
                lines.append(f"  {name}: no draft tokens graded yet (greedy)")
            else:
                lines.append(f"  {name}: {hits / trials:.2f} of {trials:.0f} graded draft tokens accepted (greedy)")
        return "\n".join(lines)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return f"learned rates {path.name}: unreadable (not used)"


def _sizes(sizes: np.ndarray) -> str:
    """``[2, 3, 4, 9]`` as ``2-4, 9``."""
    runs, start = [], None
    values = [int(s) for s in sizes]
    for i, size in enumerate(values):
        start = size if start is None else start
        if i + 1 == len(values) or values[i + 1] != size + 1:
            runs.append(f"{start}" if start == size else f"{start}-{size}")
            start = None
    return ", ".join(runs)
