"""Old code against new: the benchmark harnesses run from two checkouts, interleaved, in one run.

    python -m tools.bench.versions --old DIR --new DIR [--rounds 2] [--out PREFIX]
        [--bench-args "..."] [--batch-args "..."] [--harnesses bench,batch]

A restructuring must not cost speed. Each round runs ``python -m tools.bench`` and then
``python -m tools.bench.batch`` once from each checkout (``cwd`` and ``PYTHONPATH`` set to
it, so each process imports that checkout's ``retrieval_draft`` and ``tools``), old first
in even rounds and new first in odd ones, so a machine whose speed drifts slows both alike.
Each harness times plain HF ``generate`` beside the plugin in the same process, so the
speed-up it reports is already a side-by-side ratio; this tool compares those speed-ups
(and the plugin's tokens/s; for the benchmark also per workload, with the drafting share and
accepted tokens per step) between the checkouts, round by round. Each checkout gets its
own empty plugin cache (``RETRIEVAL_DRAFT_CACHE``), so both measure their own cost curve
once, in their first round, as a new user's first process would.

Writes PREFIX.json (every round's figures) and PREFIX.md (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from tools.bench.report import write_results

DEFAULT_BENCH = ("--workloads code_raw --systems hf,defaults --prompts 6 --max-new-tokens 128 --repeats 1 "
                 "--no-fresh-process")
DEFAULT_BATCH = "--batches 1,4,16 --max-new-tokens 128 --repeats 1 --no-mixed"


def run_harness(checkout: Path, module: str, args: list[str], cache: Path, out: Path) -> dict:
    """Run ``python -m module args`` from ``checkout``; its JSON result (written to ``out``)."""
    env = dict(os.environ, PYTHONPATH=str(checkout), RETRIEVAL_DRAFT_CACHE=str(cache))
    flag = ["--json", str(out)] if module == "tools.bench" else ["--out", str(out.with_suffix(""))]
    command = [sys.executable, "-m", module, *args, *flag]
    print(f"[versions] {checkout.name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    subprocess.run(command, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def batch_module(checkout: Path) -> str | None:
    """The batch harness's module in ``checkout``: ``tools.bench.batch`` since tools/ has rooms,
    ``tools.bench_batch`` before; None when ``checkout`` is neither."""
    if (checkout / "tools" / "bench" / "batch.py").is_file():
        return "tools.bench.batch"
    if (checkout / "tools" / "bench.py").is_file():
        return "tools.bench_batch"
    return None


def bench_figures(result: dict) -> dict:
    """The plugin's figures from a ``tools.bench`` result, per system overall and per workload and
    system (``"code_raw: defaults"``): speed-up (geometric mean over prompts, each against HF in the
    same process), tokens/s, identical rate, drafting share (over ``budget0`` where it ran) and
    accepted tokens per step."""
    summary = result["summary"]
    figures = {}
    for group, rows in summary.items():
        for name, row in rows.items():
            if name == "hf" or (group != "overall" and len(summary) <= 2):
                continue  # one workload: its rows are the overall ones
            figures[name if group == "overall" else f"{group}: {name}"] = {
                "speedup": row["speedup_geomean"], "tokens_per_s": row["tokens_per_s"],
                "identical_rate": row["identical_rate"], "share": row.get("share_geomean"),
                "accepted": row.get("mean_accepted")}
    return figures


def batch_figures(result: dict) -> dict:
    """Per batch size, from a ``tools.bench.batch`` result: speed-up, tokens/s, identical rows,
    accepted tokens per row-step and mean tree width."""
    return {str(row["rows"]): {"speedup": row["speedup"], "tokens_per_s": row["ours_tokens_per_s"],
                               "identical": f"{row['identical_rows']}/{row['rows']}",
                               "accepted": row["mean_accepted_per_row_step"], "width": row["mean_width"]}
            for row in result["batches"]}


def markdown(rounds: list[dict], old: str, new: str) -> str:
    """Median speed-ups of the two checkouts and their ratio, per harness entry, with the drafting
    share and accepted tokens per step where the entry has them."""
    lines = [f"old: `{old}`, new: `{new}`, {len(rounds)} rounds, interleaved", "",
             "| harness | entry | old speed-up | new speed-up | new / old | old tok/s | new tok/s | drafting share (old / new) "
             "| accepted/step (old / new) | identical (old / new) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for harness in ("bench", "batch"):
        if harness not in rounds[0]["old"]:
            continue
        entries = rounds[0]["old"][harness].keys()
        for entry in entries:
            pick = lambda side, key: [r[side][harness][entry].get(key) for r in rounds]  # noqa: E731
            old_up, new_up = median(pick("old", "speedup")), median(pick("new", "speedup"))
            ratio = median(n / o for n, o in zip(pick("new", "speedup"), pick("old", "speedup")))
            same_key = "identical_rate" if harness == "bench" else "identical"
            same = f"{', '.join(map(str, pick('old', same_key)))} / {', '.join(map(str, pick('new', same_key)))}"
            label = entry if harness == "bench" else f"batch {entry}"
            lines.append(f"| {'tools.bench' if harness == 'bench' else 'tools.bench.batch'} | {label} | {old_up:.3f}x | "
                         f"{new_up:.3f}x | {ratio:.3f} | {median(pick('old', 'tokens_per_s')):.1f} | "
                         f"{median(pick('new', 'tokens_per_s')):.1f} | {_pair(pick, 'share', 'x')} | "
                         f"{_pair(pick, 'accepted', '')} | {same} |")
    return "\n".join(lines) + "\n"


def _pair(pick, key: str, unit: str) -> str:
    """``old / new`` medians of ``key`` over the rounds, or blank where the entry lacks it."""
    old, new = pick("old", key), pick("new", key)
    if None in old or None in new:
        return ""
    return f"{median(old):.2f}{unit} / {median(new):.2f}{unit}"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", type=Path, required=True, help="checkout of the code before the change")
    p.add_argument("--new", type=Path, required=True, help="checkout of the code after it")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--bench-args", default=DEFAULT_BENCH)
    p.add_argument("--batch-args", default=DEFAULT_BATCH)
    p.add_argument("--harnesses", default="bench,batch", help="which harnesses to run: bench, batch or both")
    p.add_argument("--out", default="bench/results/versions")
    args = p.parse_args(argv)
    for side in (args.old, args.new):
        if batch_module(side) is None:
            p.error(f"{side}: not a checkout of this project (no tools/bench/ nor tools/bench.py)")
    harnesses = {h.strip() for h in args.harnesses.split(",")}
    if not harnesses or not harnesses <= {"bench", "batch"}:
        p.error("--harnesses takes bench, batch or bench,batch")
    sides = {"old": args.old.resolve(), "new": args.new.resolve()}
    rounds = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        caches = {side: work / f"cache-{side}" for side in sides}
        for number in range(args.rounds):
            order = ("old", "new") if number % 2 == 0 else ("new", "old")
            figures: dict = {side: {} for side in sides}
            for harness, module, extra in (("bench", "tools.bench", args.bench_args),
                                           ("batch", None, args.batch_args)):
                if harness not in harnesses:
                    continue
                for side in order:
                    out = work / f"{harness}-{side}-{number}.json"
                    name = module or batch_module(sides[side])
                    result = run_harness(sides[side], name, shlex.split(extra), caches[side], out)
                    figures[side][harness] = bench_figures(result) if harness == "bench" else batch_figures(result)
            rounds.append(figures)
            print(json.dumps(figures), file=sys.stderr, flush=True)
    result = {"command": " ".join(["python -m tools.bench.versions", *(sys.argv[1:] if argv is None else argv)]),
              "old": str(args.old), "new": str(args.new), "bench_args": args.bench_args,
              "batch_args": args.batch_args, "rounds": rounds}
    report = markdown(rounds, str(args.old), str(args.new))
    write_results(args.out, result, report)
    return result


if __name__ == "__main__":
    main()
