"""Store-scaling study: what a bigger datastore costs and what it buys, per store size.

    python -m tools.bench.store_scale [--sizes 1M,10M,all] [--model NAME] [--prompts 3] [--max-new-tokens 64]
                                      [--steps 400] [--cache user|fresh] [--json PATH] [--png PATH]

Corpus: this machine's Python sources (``scale_corpus``: deduplicated, the benchmark's held-out
packages left out); the size ``all`` takes every file of it. Per size, a store is built in this process with the model's tokenizer
(SmolLM2's by default) after a small warm-up build (so the Numba kernels' loading is not in the
first size's time), then:

- build: wall seconds of ``builder.build`` (tokenising, indexing, writing) and tokens per second;
  store bytes per token (every file of the store);
- open: ``open_datastore`` with full verification (sha256 of every file) and without, files
  in the page cache (just written);
- memory: resident memory of a process of its own that opens the store and runs the lookup
  steps' contexts, its growth against the store's file bytes (``store_memory``);
- lookup: one step = the store's drafters (n-gram table and suffix index) each proposing
  ``DRAFT_LEN`` tokens after a context of up to ``CONTEXT_LEN`` tokens of held-out code
  (HumanEval prompts with their reference solutions); p50 / p99 of ``--steps`` steps, in ms;
- accepted tokens per step: the README call (``custom_generate=retrieval_draft.generate``) with
  ``datastore=`` the store, on ``--prompts`` raw HumanEval prompts, against the same call with no
  store; each configuration on its own model handle (so no output history crosses over) and every
  output checked against plain greedy ``generate``;
- speed-up: plain greedy ``generate`` runs on each prompt just before the configuration's call
  (paired, so load from other jobs falls on both alike); speed-up = the greedy calls' wall seconds
  / the configuration's. One untimed call of each kind comes first (on a handle of its own, 8 new
  tokens), so measuring the forward-cost curve of a fresh cache is in no configuration's time.

Writes the result as JSON (atomic) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from retrieval_draft.atomic import atomic_write_bytes
from tools.bench.scale_corpus import (
    HELD_OUT_PACKAGES, SAMPLE_BYTES, bytes_per_token, corpus_files, files_for, python_roots,
)

CONTEXT_LEN = 64  # tokens of context per lookup step
DRAFT_LEN = 8  # tokens each drafter proposes per lookup step
WARM_UP_FILES = 3  # files of the untimed warm-up build
WARM_UP_TOKENS = 8  # new tokens of the untimed warm-up calls
REPO = Path(__file__).resolve().parents[2]  # store_memory runs as ``-m tools.bench.store_memory`` from here
ALL = "all"  # the size that takes every file of the corpus
UNITS = {"k": 10**3, "M": 10**6, "G": 10**9}


def parse_size(text: str) -> int | None:
    """'1M' -> 1,000,000; '2500' -> 2,500; '1.5k' -> 1,500; 'all' -> None (every file of the
    corpus). ValueError for anything else."""
    text = text.strip()
    if text == ALL:
        return None
    scale = UNITS.get(text[-1:], 1)
    number = float(text[:-1] if text[-1:] in UNITS else text)
    if number <= 0:
        raise ValueError(f"size {text!r} is not positive")
    return int(number * scale)


def held_out_contexts(tokenizer, problems: list[dict], steps: int) -> list[np.ndarray]:
    """``steps`` contexts (shape (n,), int64, n <= CONTEXT_LEN) ending at successive positions of
    the problems' prompt + reference solution, problem after problem (cycled when short)."""
    streams = [np.asarray(tokenizer(p["prompt"] + p["canonical_solution"], add_special_tokens=False)["input_ids"],
                          np.int64) for p in problems]
    ends = [(s, end) for s in streams for end in range(2, s.size)]
    return [s[max(0, end - CONTEXT_LEN):end] for s, end in (ends[i % len(ends)] for i in range(steps))]


def lookup_cost(store, contexts: list[np.ndarray], repeats: int = 3) -> dict:
    """Per step (every store drafter proposing DRAFT_LEN tokens after one context): p50 and p99
    ms of the first run, p99 of each step's fastest of ``repeats`` runs (load from other jobs
    falls out), and the share of steps where some drafter proposed anything. One untimed pass
    over the first contexts first."""
    from retrieval_draft.drafters.datastore import datastore_drafters

    drafters = datastore_drafters(store, vocab_size=store.vocab_size)
    for context in contexts[:20]:
        for drafter in drafters:
            drafter.propose(context, DRAFT_LEN)
    times, hits = np.zeros((len(contexts), repeats)), 0
    for i, context in enumerate(contexts):
        for r in range(repeats):
            started = time.perf_counter()
            drafts = [drafter.propose(context, DRAFT_LEN) for drafter in drafters]
            times[i, r] = time.perf_counter() - started
        hits += any(drafts)
    ms = 1000 * times
    return {"steps": len(contexts), "p50_ms": round(float(np.percentile(ms[:, 0], 50)), 4),
            "p99_ms": round(float(np.percentile(ms[:, 0], 99)), 4),
            "p99_min3_ms": round(float(np.percentile(ms.min(axis=1), 99)), 4), "steps_with_drafts": hits,
            "drafters": [drafter.name for drafter in drafters]}


def build_store(files, out: Path, tokenizer) -> dict:
    """Build the store of ``files`` at ``out``; wall seconds, tokens per second, sizes, and the CPU
    seconds this process spent (all its threads): tokens per CPU second is what the build needs of
    the machine whatever else runs on it, and CPU / wall seconds how many cores it had."""
    from retrieval_draft_datastore.builder import build

    started, cpu = time.perf_counter(), time.process_time()
    manifest = build([str(f.path) for f in files], out, tokenizer, progress=False)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    tokens = int(manifest["stats"]["tokens"])
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    return {"files": len(files), "text_bytes": sum(f.bytes for f in files), "tokens": tokens,
            "documents": int(manifest["stats"]["documents"]), "build_s": round(wall, 3),
            "build_tokens_per_s": round(tokens / wall), "build_cpu_s": round(cpu, 3),
            "build_tokens_per_cpu_s": round(tokens / max(cpu, 1e-9)), "build_cores_used": round(cpu / wall, 2),
            "tokenize_s": manifest["stats"].get("tokenize_seconds"), "index_s": manifest["stats"].get("index_seconds"),
            "store_bytes": size, "bytes_per_token": round(size / tokens, 3)}


def open_times(path: Path) -> dict:
    """Seconds to open the store verified (sha256 of every file) and trusted."""
    from retrieval_draft.store.opening import open_datastore

    out = {}
    for name, verify in (("open_verified_s", True), ("open_trusted_s", False)):
        started = time.perf_counter()
        open_datastore(path, verify=verify)
        out[name] = round(time.perf_counter() - started, 5)
    return out


def accepted_per_step(model, prompts: list, store: str | None, tokenizer, max_new_tokens: int) -> dict:
    """The README call on ``prompts`` (each (1, L) int64 ids) on a handle of its own, with
    ``datastore=store`` (None: no store), each just after plain greedy ``generate`` on the same
    prompt, over all prompts: tokens per step (bonus token included), tree nodes per step, ms per
    step drafting (every drafter, the store's included) and in the forward, wall seconds of both,
    the speed-up (greedy seconds / ours) and whether every output equals greedy's."""
    import torch

    import retrieval_draft
    from retrieval_draft.decode.engine import DecodeStats

    handle = copy.copy(model)  # its own plugin memory: output history, rates
    total, wall, greedy_wall, identical = DecodeStats(), 0.0, 0.0, True
    for ids in prompts:
        reference, seconds = greedy_output(model, ids, max_new_tokens)
        greedy_wall += seconds
        stats = DecodeStats()
        extra = {} if store is None else {"datastore": store, "draft_tokenizer": tokenizer}
        started = time.perf_counter()
        out = handle.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              custom_generate=retrieval_draft.generate, draft_stats=stats, **extra)
        wall += time.perf_counter() - started
        for name in ("steps", "step_tokens", "tree_nodes", "draft_s", "forward_s"):
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        identical &= out[0].tolist() == reference
    per_step = max(1, total.steps)
    return {"accepted_per_step": round(total.mean_accepted, 3), "steps": total.steps,
            "step_tokens": total.step_tokens, "tree_nodes_per_step": round(total.tree_nodes / per_step, 2),
            "draft_ms_per_step": round(1000 * total.draft_s / per_step, 3),
            "forward_ms_per_step": round(1000 * total.forward_s / per_step, 2), "wall_s": round(wall, 3),
            "greedy_wall_s": round(greedy_wall, 3), "speedup_vs_greedy": round(greedy_wall / wall, 3),
            "identical_to_greedy": identical}


def warm_up_calls(model, ids, tokenizer) -> None:
    """One untimed plain greedy call and one README call (its own handle) of ``WARM_UP_TOKENS`` new
    tokens on ``ids``: a fresh cache's forward-cost curve is measured here, in no configuration."""
    accepted_per_step(model, [ids], None, tokenizer, WARM_UP_TOKENS)


def store_memory(path: Path, warm_up: Path, contexts: Path) -> dict:
    """``tools.bench.store_memory``'s record of the store at ``path`` (a process of its own, run from
    ``REPO``; ``contexts``: the lookup steps' contexts as .npz)."""
    command = [sys.executable, "-m", "tools.bench.store_memory", str(path), "--warm-up", str(warm_up),
               "--contexts", str(contexts)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"store_memory failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def greedy_output(model, ids, max_new_tokens: int) -> tuple[list, float]:
    """Plain greedy ``generate`` on ``ids`` ((1, L) int64): (the output as a list of ids, wall seconds)."""
    import torch

    started = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0].tolist(), time.perf_counter() - started


def run_study(args: argparse.Namespace) -> dict:
    """Every size's build, open, lookup and acceptance numbers, plus the no-store baseline (module
    docstring); the result as the JSON holds it."""
    import torch

    from retrieval_draft.model.models import load_model_and_tokenizer
    from retrieval_draft.store.opening import open_datastore
    from tools.bench.cache_state import planning_records
    from tools.bench.report import load_average, machine_info
    from tools.bench.workloads import humaneval_subset

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(args.model)
    machine, cache = machine_info(), planning_records(model, args.cache)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    sizes = sorted(s for s in sizes if s is not None) + ([None] if None in sizes else [])  # all: last
    roots = [Path(r) for r in args.corpus] if args.corpus else python_roots()
    probe = corpus_files(roots, SAMPLE_BYTES, seed=args.seed)
    ratio = bytes_per_token(probe, tokenizer)
    files = corpus_files(roots, 1 << 62 if sizes[-1] is None else int(sizes[-1] * ratio * 1.02) + 1, seed=args.seed)
    problems = humaneval_subset(args.prompts + args.context_problems, args.seed)
    prompts = [tokenizer(p["prompt"], return_tensors="pt").input_ids for p in problems[:args.prompts]]
    contexts = held_out_contexts(tokenizer, problems[args.prompts:], args.steps)
    warm_up_calls(model, prompts[0], tokenizer)
    base = accepted_per_step(model, prompts, None, tokenizer, args.max_new_tokens)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="store-scale-", dir=args.work))
    try:
        build_store(files[:WARM_UP_FILES], work / "warm-up", tokenizer)  # Numba kernels loaded, untimed
        np.savez(work / "contexts.npz", *contexts)
        for size in sizes:
            chosen = files_for(files, float("inf") if size is None else size * ratio)
            path = work / f"store-{size or ALL}"
            row = {"target_tokens": size, **build_store(chosen, path, tokenizer), **open_times(path)}
            row["memory"] = store_memory(path, work / "warm-up", work / "contexts.npz")
            row["lookup"] = lookup_cost(open_datastore(path, verify=False), contexts)
            gen = accepted_per_step(model, prompts, str(path), tokenizer, args.max_new_tokens)
            row["generate"] = {k: v for k, v in gen.items() if k != "identical_to_greedy"}
            row["generate"]["speedup_vs_no_store"] = round(gen["speedup_vs_greedy"] / base["speedup_vs_greedy"], 3)
            row["identical_to_greedy"] = gen["identical_to_greedy"]
            rows.append(row)
            print(table_line(row), file=sys.stderr, flush=True)
            shutil.rmtree(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine["load_avg_end"] = load_average()
    return {
        "command": " ".join(["python", "-m", "tools.bench.store_scale", *sys.argv[1:]]),
        "machine": machine, "cache": cache,
        "config": {"sizes": [size or ALL for size in sizes], "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                   "steps": args.steps, "context_len": CONTEXT_LEN, "draft_len": DRAFT_LEN, "seed": args.seed,
                   "model": args.model or "SmolLM2-135M-Instruct (default)", "threads": args.threads},
        "corpus": {"roots": [str(r) for r in roots], "held_out_packages": list(HELD_OUT_PACKAGES),
                   "files_available": len(files), "bytes_per_token": round(ratio, 4)},
        "prompt_ids": [p["task_id"] for p in problems[:args.prompts]],
        "context_problem_ids": [p["task_id"] for p in problems[args.prompts:]],
        "no_store": base,
        "sizes": rows,
    }


HEADER = ("| tokens | files | build s | build tokens/s | bytes/token | open verified s | open trusted s "
          "| RSS growth MB (mapped MB) | lookup p50 ms | p99 ms | p99 min3 ms | steps with drafts | accepted/step "
          "| nodes/step | speed-up vs greedy | identical |")


def table_line(row: dict) -> str:
    """One markdown row of a size."""
    look, gen, memory = row["lookup"], row["generate"], row["memory"]
    per_cpu = f" ({row['build_tokens_per_cpu_s'] / 1e6:.2f}M per CPU s)" if "build_tokens_per_cpu_s" in row else ""
    return (f"| {row['tokens']:,} | {row['files']:,} | {row['build_s']:.1f} | {row['build_tokens_per_s'] / 1e6:.2f}M{per_cpu} "
            f"| {row['bytes_per_token']:.2f} | {row['open_verified_s']:.3f} | {row['open_trusted_s']:.3f} "
            f"| {memory['growth_after_lookups_mib']:.0f} ({memory['mapped_mib']:.0f}) | {look['p50_ms']:.3f} | {look['p99_ms']:.3f} | {look['p99_min3_ms']:.3f} "
            f"| {look['steps_with_drafts']}/{look['steps']} | {gen['accepted_per_step']:.2f} "
            f"| {gen['tree_nodes_per_step']:.1f} | {gen['speedup_vs_greedy']:.2f}x "
            f"| {'yes' if row['identical_to_greedy'] else 'NO'} |")


def markdown(result: dict) -> str:
    """The table of every size, and the no-store line."""
    base = result["no_store"]
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    lines += [table_line(row) for row in result["sizes"]]
    lines.append(f"| no store | | | | | | | | | | | | {base['accepted_per_step']:.2f} "
                 f"| {base['tree_nodes_per_step']:.1f} | {base['speedup_vs_greedy']:.2f}x "
                 f"| {'yes' if base['identical_to_greedy'] else 'NO'} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1M,10M", help="store sizes in tokens, comma-separated (k, M, G suffixes; "
                                                     "'all': every file of the corpus)")
    p.add_argument("--corpus", action="append", help="folder of *.py files (repeatable; default: the standard "
                                                     "library and site-packages)")
    p.add_argument("--model", help="model folder or .gguf file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--prompts", type=int, default=3, help="HumanEval prompts generated from per configuration")
    p.add_argument("--context-problems", type=int, default=10, help="HumanEval problems the lookup contexts come from")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=400, help="lookup steps timed per size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--cache", default="user", choices=("user", "fresh"),
                   help="plan from the user's cache as it is, or from a fresh one (tools.bench.cache_state)")
    p.add_argument("--work", help="folder for the stores while they are measured (default: the system's temp)")
    p.add_argument("--json", help="write the result here (atomically)")
    p.add_argument("--png", help="write the chart here (store size against accepted tokens and speed-up; matplotlib)")
    args = p.parse_args(argv)
    try:
        [parse_size(s) for s in args.sizes.split(",")]
    except (ValueError, IndexError) as exc:
        p.error(f"--sizes: {exc}")
    if args.png and importlib.util.find_spec("matplotlib") is None:
        p.error("--png needs matplotlib (pip install -e '.[bench]')")
    if min(args.prompts, args.max_new_tokens, args.steps, args.context_problems) < 1:
        p.error("--prompts, --context-problems, --max-new-tokens and --steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from tools.bench.cache_state import fresh_cache

    args = parse_args(argv)
    if args.cache == "fresh":
        with fresh_cache():
            result = run_study(args)
    else:
        result = run_study(args)
    print(markdown(result))
    if args.png:
        from tools.bench.scale_chart import plot_scale

        plot_scale(result, args.png)
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps(result, indent=1) + "\n").encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
