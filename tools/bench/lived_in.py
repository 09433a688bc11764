"""The held-out speed check on a lived-in user cache: does what the cache holds ever hold us back?

    python -m tools.bench.lived_in [--model smollm2-135m] [--workload code_raw] [--prompts 8]
                                   [--max-new-tokens 96] [--conditions fresh,curve,...] [--json PATH]

Each condition gives the plugin a user cache of its own (``RETRIEVAL_DRAFT_CACHE``, set after the
model has loaded, so the model's own kept conversion is read from the user's cache) and then calls,
per prompt in order, as a user calls them: plain ``model.generate(**inputs, max_new_tokens=N,
do_sample=False)``, the README line ``custom_generate=retrieval_draft.generate``, and the README line
with ``tree_budget=0`` (our forward, no drafts: the drafting share is ours over it). An untimed
8-token plain ``generate`` first pays torch's first-call set-up. Conditions:

- ``fresh``: an empty cache (the first call measures the cost curve from its own forwards);
- ``lived-in``: the cache ``fresh`` left behind (a second process of the same user);
- ``curve``: ``fresh``'s cache with its cost curve made 12 times dearer from 3 tokens on (the shape a
  busy hour left in a real cache, 11.6 lone roots for 3-16 tokens);
- ``curve-plausible``: the same but 1.45 lone roots per token from 3 tokens on (dearer than the truth
  yet inside the plausible limit, so only exploration and decoding's own timings can correct it);
- ``rates``: ``fresh``'s cache with every learned rate planted as never accepted (1e6 trials, no hit);
- ``rates-sure``: the other way round, every learned rate planted as always accepted (1e6 trials, all hits);
- ``lived-in-across``, ``curve-across``, ``rates-across``, ``rates-sure-across``: as the conditions they name with
  every prompt in a new process, each starting from the cache the one before it left (every call
  is then a process's first plugin call, so these compare with ``lived-in-across``, not ``fresh``).

The prompts are held out from ``tools.bench`` (seed 7 of the workload's prompt shuffle). All calls of
one condition run in one process unless the condition says "across". Per call it records wall
seconds, the speed-up over plain ``generate``, the drafting share, nodes and accepted tokens per step,
and whether the output equals plain ``generate``'s. The report compares each condition's speed-up
with ``fresh``'s on the same prompts, an across condition with ``lived-in-across``'s (geometric mean
over the last half of the calls, "recovered" when at least 90%). Time on a 2-core CPU: about 3 minutes per one-process condition with 8 prompts of 96
tokens on SmolLM2-135M, 5 per across-process one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONDITIONS = ("fresh", "lived-in", "curve", "curve-plausible", "rates", "rates-sure", "lived-in-across", "curve-across",
              "rates-across", "rates-sure-across")
HELD_OUT_SEED = 7
DEAR_FACTOR = 12.0  # ``curve``: trees of 3 tokens or more priced this many times their measured cost
PLAUSIBLE_DEAR = 1.45  # ``curve-plausible``: lone roots per token from 3 tokens on


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--workload", default="code_raw")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # run calls: JSON on stdin
    return p.parse_args(argv)


def child(args: argparse.Namespace) -> int:
    """Load the model, point the plugin at the condition's cache, time every prompt's three calls."""
    job = json.loads(sys.stdin.read())
    import torch
    import transformers

    import retrieval_draft
    from retrieval_draft.cache_dir import CACHE_ENV
    from retrieval_draft.model.models import load_model

    transformers.utils.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    os.environ[CACHE_ENV] = job["cache"]  # after loading: the model's kept conversion stays in the user's cache
    model.generate(torch.tensor([job["prompts"][0][:16]]), max_new_tokens=8, do_sample=False)  # torch's set-up
    for ids in job["prompts"]:
        inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        record = {}
        for system, extra in (("hf", {"do_sample": False}),
                              ("ours", {"custom_generate": retrieval_draft.generate}),
                              ("budget0", {"custom_generate": retrieval_draft.generate, "tree_budget": 0})):
            stats = retrieval_draft.DecodeStats() if system != "hf" else None
            if stats is not None:
                extra = {**extra, "draft_stats": stats}
            started = time.perf_counter()
            out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, **extra)
            record[f"{system}_s"] = time.perf_counter() - started
            record[f"{system}_ids"] = out[0, len(ids):].tolist()
            if system == "ours":
                record["nodes_per_step"] = stats.tree_nodes / max(stats.steps, 1)
                record["accepted_per_step"] = stats.mean_accepted
        print(json.dumps(record), flush=True)
    return 0


def run_calls(args, cache: Path, prompts: list[list[int]]) -> list[dict]:
    """One child process over ``prompts`` with the plugin's cache at ``cache``; one record per prompt."""
    command = [sys.executable, "-m", "tools.bench.lived_in", "--child", "--model", args.model,
               "--max-new-tokens", str(args.max_new_tokens)] + (["--threads", str(args.threads)] if args.threads else [])
    done = subprocess.run(command, input=json.dumps({"cache": str(cache), "prompts": prompts}),
                          capture_output=True, text=True, cwd=REPO, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"child failed: {done.stderr.strip().splitlines()[-1:]}")
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    for record in records:
        record["speedup"] = record["hf_s"] / record["ours_s"]
        record["share"] = record["budget0_s"] / record["ours_s"]
        record["budget0_speedup"] = record["hf_s"] / record["budget0_s"]
        record["identical"] = record.pop("ours_ids") == record["hf_ids"] == record.pop("budget0_ids")
        del record["hf_ids"]
    return records


def plant(cache: Path, condition: str) -> None:
    """Spoil the copy of ``fresh``'s cache at ``cache`` the way ``condition`` says."""
    import numpy as np

    if condition.startswith("curve"):
        for path in (cache / "cost-curves").glob("*.json"):
            body = json.loads(path.read_text())
            seconds = np.asarray(body["seconds"])
            sizes = np.arange(seconds.shape[0])
            if condition.startswith("curve-plausible"):
                dear = np.maximum(seconds, PLAUSIBLE_DEAR * sizes * seconds[1])
            else:
                dear = seconds * DEAR_FACTOR
            body["seconds"] = np.where(sizes >= 3, dear, seconds).tolist()
            path.write_text(json.dumps(body))
    if condition.startswith("rates"):
        sure = condition.startswith("rates-sure")  # every draft believed accepted, else none
        for path in (cache / "learned-rates").glob("*.json"):
            body = json.loads(path.read_text())
            for kind in ("greedy", "sampling"):
                for counts in body[kind].values():
                    trials = np.full_like(np.asarray(counts["trials"], dtype=float), 1e6)
                    counts["trials"] = trials.tolist()
                    counts["hits"] = (trials if sure else np.zeros_like(trials)).tolist()
            path.write_text(json.dumps(body))


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(results: dict[str, list[dict]]) -> list[dict]:
    """Per condition: speed-ups per call, the last half's geometric means and the recovery verdict."""
    rows = []
    for condition, records in results.items():
        fresh = results.get("lived-in-across" if condition.endswith("across") else "fresh")
        half = records[len(records) // 2:]
        row = {
            "condition": condition,
            "speedups": [round(r["speedup"], 2) for r in records],
            "shares": [round(r["share"], 2) for r in records],
            "nodes_per_step": [round(r["nodes_per_step"], 1) for r in records],
            "last_half_speedup": round(geomean([r["speedup"] for r in half]), 3),
            "last_half_share": round(geomean([r["share"] for r in half]), 3),
            "last_half_budget0": round(geomean([r["budget0_speedup"] for r in half]), 3),
            "identical": all(r["identical"] for r in records),
        }
        if fresh is not None:
            fresh_half = fresh[len(fresh) // 2:]
            row["of_fresh"] = round(row["last_half_speedup"] / geomean([r["speedup"] for r in fresh_half]), 3)
            row["recovered"] = row["of_fresh"] >= 0.9
        rows.append(row)
    return rows


def markdown(rows: list[dict], args) -> str:
    lines = [
        f"Held-out check, {args.model}, {args.workload} (seed {HELD_OUT_SEED}), {args.prompts} prompts x "
        f"{args.max_new_tokens} new tokens; each condition's own user cache (see `tools/bench/lived_in.py`).",
        "",
        "| cache | speed-up per call (ours / plain `generate`) | drafting share per call | nodes per step | "
        "last half: speed-up / share / `tree_budget=0` | of fresh | identical |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['condition']} | {' '.join(f'{v:.2f}' for v in row['speedups'])} | "
            f"{' '.join(f'{v:.2f}' for v in row['shares'])} | {' '.join(f'{v:.1f}' for v in row['nodes_per_step'])} | "
            f"{row['last_half_speedup']:.2f}x / {row['last_half_share']:.2f}x / {row['last_half_budget0']:.2f}x | "
            f"{row.get('of_fresh', float('nan')):.0%} | {'yes' if row['identical'] else 'NO'} |"
        )
    return "\n".join(lines)


def held_out_prompts(args) -> list[list[int]]:
    from retrieval_draft.model.models import load_tokenizer
    from tools.bench.workloads import build_workloads

    tokenizer = load_tokenizer(args.model)
    prompts = build_workloads([args.workload], args.prompts, HELD_OUT_SEED, tokenizer)[args.workload]
    encoded = []
    for prompt in prompts:
        if prompt.chat:
            messages = [{"role": "user", "content": prompt.text}]
            encoded.append(list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)))
        else:
            encoded.append(list(tokenizer(prompt.text)["input_ids"]))
    return encoded


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    conditions = [c for c in args.conditions.split(",") if c]
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise SystemExit(f"unknown conditions {unknown}; choose from {', '.join(CONDITIONS)}")
    if conditions and conditions[0] != "fresh":
        conditions = ["fresh"] + [c for c in conditions if c != "fresh"]  # every other condition starts from it
    prompts = held_out_prompts(args)
    root = Path(tempfile.mkdtemp(prefix="lived-in-"))
    results: dict[str, list[dict]] = {}
    try:
        for condition in conditions:
            cache = root / condition
            if condition != "fresh":
                shutil.copytree(root / "fresh-left", cache)
                plant(cache, condition)
            else:
                cache.mkdir()
            print(f"{condition} ...", file=sys.stderr, flush=True)
            if condition.endswith("across"):
                results[condition] = [r for ids in prompts for r in run_calls(args, cache, [ids])]
            else:
                results[condition] = run_calls(args, cache, prompts)
            if condition == "fresh":
                shutil.copytree(cache, root / "fresh-left")
            write_json(args, results)  # after every condition: a run cut short keeps what it measured
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(markdown(summary(results), args))
    return 0


def write_json(args, results: dict[str, list[dict]]) -> None:
    """The conditions measured so far, with their summary rows, to ``--json`` (atomically)."""
    if args.json:
        from retrieval_draft.atomic import atomic_write_bytes

        body = {"args": vars(args), "rows": summary(results), "records": results}
        atomic_write_bytes(Path(args.json), json.dumps(body, indent=1).encode("utf-8"))


if __name__ == "__main__":
    sys.exit(main())
