"""vLLM's speculative methods side by side on this CPU: none, ``ngram``, ``suffix`` and ours.

    .venv-vllm/bin/python -m tools.bench.vllm [--workloads code_raw,grounded,chat,rag] [--prompts 8]
        [--max-tokens 128] [--k 8] [--concurrency 1,8] [--systems plain,ngram,suffix,ours,ours_store]
        [--datastore DIR] [--model smollm2|tiny] [--out PREFIX]

Runs with ``.venv-vllm`` (``make vllm-check`` sets it up). The prompts are the benchmark's own
(``tools.bench.workloads``), the same ids for every system. Systems (``tools.vllm_engine``):

- ``plain``: no speculation; the reference for speed and for output;
- ``ngram``: vLLM's prompt lookup (``prompt_lookup_min`` 2, ``prompt_lookup_max`` 5);
- ``suffix``: vLLM's SuffixDecoding; ``arctic_inference.suffix_decoding`` is the ``arctic-inference``
  sdist's C++ core built alone (``tools.bench.peers``: cmake + nanobind, no CUDA; the full package
  wants a CUDA torch to build), which ``make vllm-check`` puts on ``.venv-vllm``'s path with a
  ``.pth`` file, so the processes vLLM spawns import it too;
- ``ours``: ``RetrievalDraftProposer`` with prompt lookup and the output history;
- ``ours_store``: the same plus ``--datastore`` (``RETRIEVAL_DRAFT_VLLM_DATASTORE``), e.g. a
  store built with ``retrieval-draft build`` from the standard library.

Each (concurrency, system) gets a fresh engine (its output history and suffix cache start empty),
warmed by one short request, then runs every workload: at concurrency 1 one request at a time, at
concurrency c the workload's prompts submitted together with ``max_num_seqs=c``. Greedy, EOS
ignored, so every request decodes ``--max-tokens`` tokens. Reported per workload, concurrency and
system: output tokens per second (all requests' tokens over the wall time), mean latency per
request, vLLM's mean acceptance length (1 + accepted / drafts: tokens per verifying step of a
request that drafted) and draft acceptance rate (accepted / draft tokens) from its spec-decode
counters, and how many outputs equal ``plain``'s at the same concurrency. Writes PREFIX.md and
PREFIX.json (default ``bench/results/<date>-vllm-<model>``).

Each engine start takes about a minute on 2 cores; the timings need a quiet machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from tools.vllm_engine import (
    engine, prompt_ids, smollm2_folder, spec_counters, speculative_config, tiny_model_folder, greedy,
)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
MODELS = Path(__file__).resolve().parents[2] / ".cache" / "vllm-models"
SYSTEMS = ("plain", "ngram", "suffix", "ours", "ours_store")
ENV_STORE = "RETRIEVAL_DRAFT_VLLM_DATASTORE"
REPO = "repo"  # completions of a held-out file of one package, whose other files form the store


def repo_source(package: str):
    """The ``RepoSource`` of ``tools.bench.repo_workloads`` for ``package``."""
    from tools.bench.repo_workloads import REPO_SOURCES

    for source in REPO_SOURCES:
        if source.package == package:
            return source
    raise ValueError(f"no repo source for {package!r}; choose from {', '.join(s.package for s in REPO_SOURCES)}")


def vllm_workloads(names: list[str], n: int, seed: int, tokenizer, package: str = "click") -> tuple[dict, list[str]]:
    """(workload -> prompts' token ids, the stores the workloads bring): the benchmark's workloads
    (``tools.bench.workloads``) and ``repo``: raw completions of documented functions of one
    package's held-out file (``repo_workloads``: the file up to the function's docstring), whose
    store is the rest of the package (built once under ``.cache/bench-repo-stores/``)."""
    from tools.bench.repo_workloads import repo_prompts
    from tools.bench.workloads import build_workloads

    plain = [name for name in names if name != REPO]
    built = build_workloads(plain, n, seed)
    out = {name: [prompt_ids(tokenizer, p.text, p.chat, p.turns) for p in built[name]] for name in plain}
    stores: list[str] = []
    if REPO in names:
        prompts = repo_prompts(n, seed, chat=False, tokenizer=tokenizer, sources=(repo_source(package),))
        out[REPO] = [prompt_ids(tokenizer, p.text, False) for p in prompts]
        stores = sorted({p.store for p in prompts})
    return {name: out[name] for name in names}, stores


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    p.add_argument("--workloads", default="code_raw,grounded,chat,rag")
    p.add_argument("--prompts", type=int, default=8, help="prompts per workload")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    p.add_argument("--concurrency", default="1,8", help="comma-separated concurrency levels")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--datastore", default=None, help="store folder(s), os.pathsep-separated, for ours_store")
    p.add_argument("--repo-package", default="click", help="the package of the repo workload (tools.bench.repo_workloads)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output prefix (default bench/results/<date>-vllm-<model>)")
    args = p.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or "plain" not in args.systems:
        p.error(f"--systems takes plain and any of {', '.join(SYSTEMS[1:])}; got {', '.join(args.systems)}")
    return args


def unavailable(systems: list[str], datastore: str | None) -> dict[str, str]:
    """System -> why it cannot run here (``datastore``: every store ``ours_store`` would open)."""
    reasons = {}
    if "ours_store" in systems and not datastore:
        reasons["ours_store"] = "no --datastore given and no repo workload"
    if "suffix" in systems and importlib.util.find_spec("arctic_inference") is None:
        reasons["suffix"] = ("arctic_inference does not import in this venv (make vllm-check builds SuffixDecoding's "
                             "core from the arctic-inference sdist and adds it with a .pth file; it needs cmake)")
    return reasons


def run_workload(llm, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """One workload through ``llm``: outputs, wall time, per-request latencies and the change in
    vLLM's spec-decode counters."""
    before = spec_counters(llm)
    params = greedy(max_tokens)
    outputs, latencies = [], []
    started = time.perf_counter()
    for start in range(0, len(prompts), concurrency):
        group = prompts[start: start + concurrency]
        sent = time.perf_counter()
        results = llm.generate([{"prompt_token_ids": ids} for ids in group], params, use_tqdm=False)
        wall = time.perf_counter() - sent
        for result in results:
            outputs.append(list(result.outputs[0].token_ids))
            latencies.append(_latency(result, wall))
    wall = time.perf_counter() - started
    after = spec_counters(llm)
    return {"outputs": outputs, "wall_s": wall, "latencies_s": latencies,
            "counters": {key: after[key] - before[key] for key in after}}


def _latency(result, group_wall: float) -> float:
    """Seconds from the request's queueing to its last token (vLLM's engine timestamps), else the group's wall time."""
    metrics = getattr(result, "metrics", None)
    queued, last = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "last_token_ts", 0.0)
    return last - queued if queued and last > queued else group_wall


def run_system(system: str, folder: Path, workloads: dict, concurrency: int, args) -> dict:
    """Every workload through a fresh engine for ``system`` at ``concurrency``: workload -> ``run_workload``."""
    if system == "ours_store":
        os.environ[ENV_STORE] = args.stores
    try:
        spec = speculative_config("ours" if system == "ours_store" else system, args.k)
        with engine(folder, spec, max_model_len=4096, max_num_seqs=max(concurrency, 1)) as llm:
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], greedy(4), use_tqdm=False)  # warm-up
            return {name: run_workload(llm, prompts, concurrency, args.max_tokens) for name, prompts in workloads.items()}
    finally:
        os.environ.pop(ENV_STORE, None)


def summarise(name: str, concurrency: int, system: str, run: dict, reference: dict) -> dict:
    """One table row: a system's figures on one workload at one concurrency."""
    tokens = sum(len(output) for output in run["outputs"])
    counters = run["counters"]
    same = sum(ours == theirs for ours, theirs in zip(run["outputs"], reference["outputs"]))
    return {
        "workload": name, "concurrency": concurrency, "system": system, "requests": len(run["outputs"]),
        "output_tokens": tokens, "wall_s": round(run["wall_s"], 3),
        "tokens_per_s": round(tokens / run["wall_s"], 2) if run["wall_s"] else None,
        "mean_latency_s": round(sum(run["latencies_s"]) / len(run["latencies_s"]), 3) if run["latencies_s"] else None,
        "acceptance_length": round(1 + counters["accepted"] / counters["drafts"], 3) if counters["drafts"] else None,
        "draft_acceptance": round(counters["accepted"] / counters["draft_tokens"], 3) if counters["draft_tokens"] else None,
        "counters": counters, "identical": same,
    }


def markdown(result: dict) -> str:
    """The results as a markdown table, speed-up against ``plain`` at the same concurrency."""
    config = result["config"]
    lines = [f"# vLLM speculative methods, {config['model']} ({result['machine']['date']})", "",
             f"`{result['command']}`", "",
             f"vLLM {result['machine']['vllm']}, torch {result['machine']['torch']}, {result['machine']['cpu']}, "
             f"{result['machine']['cores']} cores, load average (1, 5, 15 min) at start {result['machine']['load_avg_start']}, "
             f"at end {result['machine'].get('load_avg_end')}; "
             f"float32, eager, greedy, {config['max_tokens']} tokens per request, num_speculative_tokens {config['k']}.",
             ""]
    for system, reason in result["unavailable"].items():
        lines.append(f"- `{system}` not run: {reason}")
    lines += ["", "| workload | concurrency | system | output tok/s | vs plain | mean latency (s) "
              "| acceptance length | draft acceptance | identical to plain |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    plain = {(r["workload"], r["concurrency"]): r for r in result["rows"] if r["system"] == "plain"}
    for row in result["rows"]:
        base = plain[(row["workload"], row["concurrency"])]["tokens_per_s"]
        ratio = f"{row['tokens_per_s'] / base:.2f}x" if base and row["tokens_per_s"] else "n/a"
        length = "" if row["acceptance_length"] is None else f"{row['acceptance_length']:.2f}"
        rate = "" if row["draft_acceptance"] is None else f"{100 * row['draft_acceptance']:.0f}%"
        lines.append(f"| {row['workload']} | {row['concurrency']} | {row['system']} | {row['tokens_per_s']:.1f} | {ratio} "
                     f"| {row['mean_latency_s']:.2f} | {length} | {rate} | {row['identical']}/{row['requests']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from tools.bench.report import load_average

    load_start = load_average()
    import vllm
    from transformers import AutoTokenizer

    from tools.bench.report import machine_info, write_results

    folder = (smollm2_folder if args.model == "smollm2" else tiny_model_folder)(MODELS / args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    workloads, repo_stores = vllm_workloads(args.workloads, args.prompts, args.seed, tokenizer, args.repo_package)
    args.stores = os.pathsep.join(([args.datastore] if args.datastore else []) + repo_stores) or None
    reasons = unavailable(args.systems, args.stores)
    rows = []
    for concurrency in args.concurrency:
        runs = {}
        for system in [s for s in args.systems if s not in reasons]:
            print(f"concurrency {concurrency}: {system} ...", file=sys.stderr, flush=True)
            runs[system] = run_system(system, folder, workloads, concurrency, args)
        for system, by_workload in runs.items():
            rows += [summarise(name, concurrency, system, run, runs["plain"][name]) for name, run in by_workload.items()]
    machine = machine_info() | {"vllm": vllm.__version__, "load_avg_start": load_start, "load_avg_end": load_average()}
    result = {"command": "python -m tools.bench.vllm " + " ".join(sys.argv[1:] if argv is None else argv),
              "config": {key: value for key, value in vars(args).items() if key != "out"},
              "machine": machine, "unavailable": reasons, "rows": rows}
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    write_results(args.out or RESULTS / f"{stamp}-vllm-{args.model}", result, markdown(result))
    return 0 if all(row["identical"] == row["requests"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
