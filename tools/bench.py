"""The benchmark harness: every speed claim comes from here.

    python tools/bench.py [--quick] [--json PATH] [--png PATH] [--datastore DIR]
                          [--max-new-tokens N] [--repeats N] [--prompts N]
                          [--workloads a,b] [--systems a,b] [--sampling]

Per prompt, every system runs in turn (order rotated between repeats and
prompts) on the same prompt ids. Under greedy decoding HF runs first in the
first repeat: its output is the reference for the identical-to-greedy check
and for the oracle. Model loading and warm-up are outside every timing. Our
systems keep the plugin's default learning across calls: each run starts from
the acceptance rates the runs before it observed (outputs and their histories
never pass between runs); ``prompt_fresh`` turns that off for comparison.
The markdown table goes to stdout, progress to stderr. See ``bench_report``
for the metric definitions;
``python tools/bench_report.py RESULT.json`` re-renders a saved run.

Time on an idle 2-core CPU (SmolLM2-135M): --quick ~1 minute, full (8 prompts
x 4 workloads, 128 tokens, 2 repeats, 4 systems without a datastore) ~17
minutes; each datastore system adds about a quarter. On a machine shared with
other jobs, OpenMP's spinning threads can make every forward pass ~6x slower;
the report flags a busy machine, and OMP_WAIT_POLICY=PASSIVE avoids the
collapse (but costs ~75% per forward pass when the machine is idle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import torch  # noqa: E402
from datastore.atomic import atomic_write_bytes  # noqa: E402

from bench_report import load_average, machine_info, markdown, per_prompt, plot, summarize  # noqa: E402
from bench_systems import SYSTEMS, RunSetup, prefill_seconds, run_system, unavailable_reason  # noqa: E402
from bench_workloads import WORKLOADS, BenchPrompt, build_workloads  # noqa: E402

QUICK = {"prompts": 1, "max_new_tokens": 32, "repeats": 1, "systems": "hf,hf_pld,prompt,oracle"}
FULL = {"prompts": 8, "max_new_tokens": 128, "repeats": 2, "systems": ",".join(SYSTEMS)}
WARMUP_TOKENS = 8
OUTPUT_HEAD_CHARS = 160  # of each prompt and HF output, kept in the JSON to show what was generated


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; unset ones take the quick or full defaults."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"smoke test: {QUICK}")
    p.add_argument("--json", help="write the full results as JSON here")
    p.add_argument("--png", help="write a speedup chart (PNG) here")
    p.add_argument("--markdown", help="also write the markdown report here")
    p.add_argument("--model", default=None, help="local model directory or .gguf (default SmolLM2-135M)")
    p.add_argument("--datastore", default=None, help="datastore directory for the ngram/suffix/all systems")
    p.add_argument("--history", type=Path, default=None,
                   help="saved output history (tools/warm_history.py) for the history system")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--prompts", type=int, help="prompts per workload")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {','.join(WORKLOADS)}")
    p.add_argument("--systems", help=f"comma list of {','.join(SYSTEMS)}")
    p.add_argument("--sampling", action="store_true", help="sample instead of greedy (identical rate n/a)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (with --sampling)")
    p.add_argument("--tree-budget", type=int, help="our plugin's tree_budget (default: the plugin's)")
    p.add_argument("--max-draft-len", type=int, help="our plugin's max_draft_len (default: the plugin's)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="prompt subset and sampling seed")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.workloads or any(w not in WORKLOADS for w in args.workloads):
        p.error(f"--workloads takes a comma list of {', '.join(WORKLOADS)}")
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if "hf" not in args.systems:
        args.systems.insert(0, "hf")  # the baseline of every speedup
    return args


def load_datastore(path: str | None, session) -> tuple[dict, str | None]:
    """The datastore's drafters by name, or ({}, why not). Bad datastores raise."""
    if path is None:
        return {}, "no datastore given"
    try:
        from retrieval_draft.drafters.datastore import datastore_drafters
    except ImportError as error:
        return {}, f"datastore modules missing ({error})"
    found = datastore_drafters(path, vocab_size=session.model.config.vocab_size, tokenizer=session.tokenizer)
    return {d.name: d for d in found}, None


def encode(session, prompt: BenchPrompt) -> torch.Tensor:
    """Prompt ids, shape (1, L), the same tensor for every system."""
    from retrieval_draft.session import GenerationRequest

    return session.encode(GenerationRequest(prompt=prompt.text, chat=prompt.chat))


def plugin_kwargs(args: argparse.Namespace) -> dict:
    """Our plugin's options set on the command line (the rest keep the plugin's defaults)."""
    pairs = (("tree_budget", args.tree_budget), ("max_draft_len", args.max_draft_len))
    return {key: value for key, value in pairs if value is not None}


def make_setup(session, args, ids, reference, datastore, max_new_tokens, seed) -> RunSetup:
    """The shared inputs of one timed run."""
    sampling = {"temperature": args.temperature} if args.sampling else {}
    return RunSetup(
        session.model, ids, max_new_tokens, sampling, seed, reference, datastore, plugin_kwargs(args), args.history
    )


def warm_up(session, args, ids, systems, datastore) -> None:
    """Run every system once on a short generation, untimed (first-call costs stay out)."""
    setup = make_setup(session, args, ids, None, datastore, WARMUP_TOKENS, args.seed)
    reference = run_system(SYSTEMS["hf"], setup).output[0].numpy()
    setup = make_setup(session, args, ids, reference, datastore, WARMUP_TOKENS, args.seed)
    for name in systems:
        run_system(SYSTEMS[name], setup)


def run_order(systems: list[str], repeat: int, index: int, greedy: bool) -> list[str]:
    """Systems in this repeat's order: rotated by repeat + prompt index.

    Under greedy decoding, repeat 0 runs HF first: its output is the reference
    that the oracle replays and every other output is compared with.
    """
    if greedy and repeat == 0:
        rest = [s for s in systems if s != "hf"]
        shift = index % max(len(rest), 1)
        return ["hf", *rest[shift:], *rest[:shift]]
    shift = (repeat + index) % len(systems)
    return systems[shift:] + systems[:shift]


def bench_prompt(session, args, index: int, prompt: BenchPrompt, ids, systems, datastore):
    """Every system on one prompt, ``args.repeats`` times, interleaved.

    Returns (one record per run, HF's first output of shape (1, L + m)).
    """
    prefill = prefill_seconds(session.model, ids)
    reference_out, first_hf, records = None, None, []
    for repeat in range(args.repeats):
        for position, name in enumerate(run_order(systems, repeat, index, not args.sampling)):
            seed = args.seed + 1000 * index + repeat
            reference = None if reference_out is None else reference_out[0].numpy()
            setup = make_setup(session, args, ids, reference, datastore, args.max_new_tokens, seed)
            result = run_system(SYSTEMS[name], setup)
            if name == "hf" and first_hf is None:
                first_hf = result.output
                reference_out = None if args.sampling else first_hf
            identical = None if args.sampling else bool(torch.equal(result.output, reference_out))
            record = {"workload": prompt.workload, "prompt_id": prompt.prompt_id, "system": name}
            record.update(_timing(result, ids.shape[1], prefill), repeat=repeat, order=position)
            record.update(identical=identical, stats=_stats_dict(result.stats), load_1m=(load_average() or [None])[0])
            records.append(record)
    return records, first_hf


def _timing(result, prompt_tokens: int, prefill: float) -> dict:
    """New tokens, wall, prefill and decode seconds, decode tokens/s of one run."""
    new_tokens = int(result.output.shape[1] - prompt_tokens)
    decode = max(result.wall_s - prefill, 1e-9)
    return {
        "new_tokens": new_tokens,
        "wall_s": round(result.wall_s, 5),
        "prefill_s": round(prefill, 5),
        "decode_s": round(decode, 5),
        "tokens_per_s": round(new_tokens / decode, 4),
    }


def _stats_dict(stats) -> dict | None:
    """The DecodeStats numbers the report needs (None for HF systems)."""
    if stats is None:
        return None
    return {
        "steps": stats.steps,
        "step_tokens": stats.step_tokens,
        "tree_nodes": stats.tree_nodes,
        "draft_s": round(stats.draft_s, 5),
        "verify_s": round(stats.verify_s, 5),
        "decode_s": round(stats.decode_s, 5),
        "mean_accepted": round(stats.mean_accepted, 4),
    }


def _progress(prompt: BenchPrompt, records: list[dict]) -> None:
    speeds = {}
    for r in records:
        speeds.setdefault(r["system"], []).append(r["tokens_per_s"])
    text = ", ".join(f"{name} {sorted(v)[len(v) // 2]:.1f}" for name, v in speeds.items())
    print(f"[bench] {prompt.workload}/{prompt.prompt_id}: tok/s {text}", file=sys.stderr, flush=True)


def select_systems(args, has_datastore: bool) -> tuple[list[str], dict]:
    """(runnable system names, {unavailable name: reason}) in ``args.systems`` order."""
    unavailable = {}
    for name in args.systems:
        reason = unavailable_reason(SYSTEMS[name], has_datastore, args.sampling, args.history is not None)
        if reason:
            unavailable[name] = reason
    return [s for s in args.systems if s not in unavailable], unavailable


def run(args: argparse.Namespace) -> dict:
    """Load, warm up, time every prompt; return the result dict (see ``bench_report``)."""
    from retrieval_draft.session import load_session

    torch.set_num_threads(args.threads)
    workloads = build_workloads(args.workloads, args.prompts, args.seed)
    session = load_session(args.model)
    datastore, no_datastore = load_datastore(args.datastore, session)
    runnable, unavailable = select_systems(args, bool(datastore))
    prompts = [p for group in workloads.values() for p in group]
    encoded = [encode(session, p) for p in prompts]
    machine = machine_info()
    started = time.perf_counter()
    warm_up(session, args, encoded[0], runnable, datastore)
    runs, heads = [], []
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        records, hf_out = bench_prompt(session, args, index, prompt, ids, runnable, datastore)
        _progress(prompt, records)
        runs.extend(records)
        heads.append(session.decode_new(ids, hf_out)[:OUTPUT_HEAD_CHARS])
    machine["load_avg_end"] = load_average()
    result = {"machine": machine, "config": run_config(args, no_datastore), "unavailable": unavailable}
    result["command"] = " ".join(["python", "tools/bench.py", *sys.argv[1:]])
    result["labels"] = {name: SYSTEMS[name].label for name in args.systems}
    result["labels"]["hf"] = "HF " + (f"sampling T={args.temperature}" if args.sampling else "greedy") + " generate"
    result["prompts"] = [
        {"workload": p.workload, "prompt_id": p.prompt_id, "chat": p.chat, "prompt_tokens": int(ids.shape[1]),
         "prompt_head": p.text[:OUTPUT_HEAD_CHARS], "hf_output_head": head}
        for p, ids, head in zip(prompts, encoded, heads)
    ]
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    result["runs"] = runs
    result["per_prompt"] = per_prompt(runs)
    result["summary"] = summarize(runs, result["per_prompt"])
    for systems in result["summary"].values():
        systems.update({name: {"status": reason} for name, reason in unavailable.items()})
    return result


def run_config(args: argparse.Namespace, no_datastore: str | None) -> dict:
    """The settings of this run, for the report."""
    from retrieval_draft.models import default_model_path

    model_path = args.model or default_model_path()
    return {
        "model": model_path,
        "model_short": Path(model_path).stem,
        "workloads": args.workloads,
        "systems": args.systems,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "prompts_per_workload": args.prompts,
        "sampling": args.sampling,
        "temperature": args.temperature if args.sampling else None,
        "seed": args.seed,
        "threads": args.threads,
        "quick": args.quick,
        "datastore": args.datastore,
        "datastore_status": no_datastore or "loaded",
        "history": str(args.history) if args.history else None,
        "plugin_kwargs": plugin_kwargs(args),
        "plugin_defaults": plugin_defaults(),
        "code": code_version(),
    }


def plugin_defaults() -> dict:
    """Our plugin's simple keyword defaults (tree_budget, max_draft_len, ...), as this checkout has them."""
    import inspect

    from retrieval_draft.hf import generate as plugin_generate

    simple = (bool, int, float, str)
    params = inspect.signature(plugin_generate).parameters.values()
    return {p.name: p.default for p in params if isinstance(p.default, simple) and p.name != "synced_gpus"}


def code_version() -> dict:
    """The git commit of this checkout and how many files differ from it."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    except OSError:
        return {"commit": None, "changed_files": None}
    return {"commit": commit or None, "changed_files": len(status.splitlines())}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the markdown report; write JSON / PNG / markdown when asked."""
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    result = run(args)
    report = markdown(result)
    print(report)
    if args.markdown:
        atomic_write_bytes(Path(args.markdown), report.encode("utf-8"))
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps(result, indent=1) + "\n").encode("utf-8"))
    if args.png:
        plot(result, args.png)
    identical = [r["identical"] for r in result["runs"] if r["identical"] is not None]
    return 0 if all(identical) else 1


if __name__ == "__main__":
    sys.exit(main())
