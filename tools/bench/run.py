"""The benchmark harness: every speed claim comes from here.

    python -m tools.bench [--quick] [--json PATH] [--png PATH] [--datastore DIR]
                          [--max-new-tokens N] [--repeats N] [--prefill-tries N] [--prompts N] [--history FILE]
                          [--workloads a,b] [--systems a,b] [--sampling] [--[no-]fresh-process]
                          [--device cuda --dtype bfloat16] [--save-prompts FILE | --prompts-from FILE]
                          [--cache user|fresh]

What is measured: the wall time of single ``model.generate`` calls, called as
users call them. Our README systems (``tools.bench.systems``) pass exactly the
README's lines with default options: ``defaults`` passes no ``drafters=``
(the plugin's prompt lookup + output history), ``datastore`` passes
``datastore=PATH`` (the ``--datastore`` string) and ``draft_tokenizer=``; on the
repository-completion workloads (``--workloads repo``: ``repo_raw``, ``repo_chat``)
it passes ``datastore=[REPO_STORE, PATH]``, the prompt package's store without the
held-out file (``tools.bench.repo_workloads``; built before timing, opened inside it).
One-off costs of ours (measuring or loading the cost curve, opening the
store) fall inside the timed calls that meet them first; the report states what the user cache
held for the model when the run began (``--cache fresh``: a folder of its own with no planning
records; the default plans from the user's cache as it is: ``cache_state``); the only untimed
warm-up is one plain HF greedy ``generate`` of 8 tokens (torch's first-call
set-up, which every system would otherwise charge to whichever runs first).
Diagnostic systems pass explicit ``drafters=`` (prompt lookup alone, a warm
history, the oracle ceiling) to explain the numbers; no README line does.

Per prompt, every system runs in turn (order rotated between repeats and
prompts) on the same prompt ids. Under greedy decoding HF runs first in the
first repeat: its output is the reference for the identical-to-greedy check
and for the oracle. Each of our systems calls ``generate`` on its own handle
per workload and repeat (``ModelHandles``): the plugin's per-model memory then
holds only that system's earlier prompts of that workload and repeat, as in
a process serving them in order, never the same prompt's output.

``--fresh-process`` (on in full runs, off with --quick) adds, per workload,
one prompt as the first call of a new Python process, ours and plain HF each
in their own (``tools.bench.fresh``, ``first_call``): import and load times apart,
then the call's wall time; the first-call ratio is plain / ours.

``--device cuda`` (with ``--dtype``) times the same calls on a GPU, the model moved there
after loading; the clock is read after the stream has synchronised. ``--save-prompts FILE``
writes the prompts this checkout builds and stops; ``--prompts-from FILE`` times those
instead of building them, so a lent GPU machine (other packages, no HumanEval) runs
the prompts the CPU tables ran.

The markdown report goes to stdout, progress to stderr. See ``tools.bench.report``
for the metric definitions.

Time on an idle 2-core CPU (SmolLM2-135M): --quick ~2 minutes, full (8
prompts x 4 workloads, 128 tokens, 2 repeats, 5 systems without a datastore
or history) ~20 minutes, plus ~3 minutes for the fresh processes; the
datastore system adds about a fifth. On a machine shared with other jobs,
OpenMP's spinning threads can make every forward pass ~6x slower; the report
flags a busy machine, and OMP_WAIT_POLICY=PASSIVE avoids the collapse (but
costs ~75% per forward pass when the machine is idle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from retrieval_draft.atomic import atomic_write_bytes
from tools.bench.cache_state import CACHE_MODES, fresh_cache, planning_records
from tools.bench.exactness import near_tie_verdicts
from tools.bench.fresh import fresh_geomean, fresh_process_rows, readme_call
from tools.bench.report import derive, load_average, machine_info, markdown, plot
from tools.bench.systems import (
    SYSTEMS, ModelHandles, RunSetup, generate_kwargs, prefill_seconds, readme_datastore, run_system, unavailable_reason,
)
from tools.bench.workloads import (
    CODE_WORKLOADS, REPO_WORKLOADS, TEXT_WORKLOADS, WORKLOADS, BenchPrompt, build_workloads, read_prompts, save_prompts,
)
from tools.gpu_check import DTYPES

QUICK = {
    "prompts": 1, "max_new_tokens": 32, "repeats": 1, "fresh_process": False,
    "systems": "hf,hf_pld,defaults,datastore,prompt,oracle", "prefill_tries": 1,
}
FULL = {"prompts": 8, "max_new_tokens": 128, "repeats": 2, "fresh_process": True, "systems": ",".join(SYSTEMS),
        "prefill_tries": 3}
WARMUP_TOKENS = 8
WARMUP = (f"one plain HF greedy generate of {WARMUP_TOKENS} tokens (torch's first-call set-up), and one with HF's "
          "static cache when hf_compiled runs (its compile, on a GPU); nothing of ours")
OUTPUT_HEAD_CHARS = 160  # of each prompt and HF output, kept in the JSON to show what was generated


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; unset ones take the quick or full defaults."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"smoke test: {QUICK}")
    p.add_argument("--json", help="write the full results as JSON here")
    p.add_argument("--png", help="write a speedup chart (PNG) here")
    p.add_argument("--markdown", help="also write the markdown report here")
    p.add_argument("--model", default=None, help="local model directory, .gguf, or a model name: smollm2-135m, "
                                                 "gemma3-270m, qwen2.5-coder-0.5b (default smollm2-135m)")
    p.add_argument("--datastore", default=None, help="datastore directory: the datastore system passes datastore=DIR")
    p.add_argument("--datastore-b", default=None,
                   help="a second datastore directory for the datastore_b system (compare two stores side by side)")
    p.add_argument("--history", type=Path, default=None,
                   help="saved output history (retrieval-draft generate --history FILE saves one) for the history diagnostic")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--prefill-tries", type=int,
                   help="forward passes over each prompt, the fastest taken as its prefill (default: 3, 1 with --quick)")
    p.add_argument("--prompts", type=int, help="prompts per workload")
    p.add_argument("--workloads", default="code",
                   help=f"comma list of {','.join(WORKLOADS)}; 'code' = {','.join(CODE_WORKLOADS)} (default), "
                        f"'text' = {','.join(TEXT_WORKLOADS)}, 'long' / 'long_raw' = whole-module edits (chat / raw), 'all' = code and text, "
                        f"'repo' = {','.join(REPO_WORKLOADS)} (held-out functions of installed packages; "
                        "the datastore systems pass datastore=[repo store, --datastore])")
    p.add_argument("--systems", help=f"comma list of {','.join(SYSTEMS)}")
    p.add_argument("--fresh-process", action=argparse.BooleanOptionalAction, default=None,
                   help="also time one first call per workload in new processes (default: on, off with --quick)")
    p.add_argument("--sampling", action="store_true", help="sample instead of greedy (identical rate n/a)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (with --sampling)")
    p.add_argument("--tree-budget", type=int, help="our plugin's tree_budget (default: the plugin's)")
    p.add_argument("--max-draft-len", type=int, help="our plugin's max_draft_len (default: the plugin's)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="prompt subset and sampling seed")
    p.add_argument("--device", default="cpu", help="torch device to time on (cpu, cuda); the fresh processes are CPU only")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="the model's dtype (default float32)")
    p.add_argument("--cache", default="user", choices=CACHE_MODES,
                   help="plan from the user's cache as earlier runs left it (user, the default) or from a fresh one (fresh)")
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument("--save-prompts", type=Path, help="write the selected workloads' prompts to this JSON file and stop")
    prompts.add_argument("--prompts-from", type=Path, help="time the prompts of a --save-prompts file instead of building them")
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device}: not a torch device (cpu, cuda, cuda:1, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this torch build or machine has no CUDA device")
    if device.type != "cpu":  # the fresh processes time CPU processes
        if args.fresh_process:
            p.error("--fresh-process times CPU processes; leave it out with --device")
        args.fresh_process = False
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.prompts_from is not None and not args.prompts_from.is_file():
        p.error(f"--prompts-from {args.prompts_from}: no such file")
    groups = {"code": CODE_WORKLOADS, "text": TEXT_WORKLOADS, "repo": REPO_WORKLOADS,
              "all": CODE_WORKLOADS + TEXT_WORKLOADS}
    args.workloads = [w for part in args.workloads.split(",") if part.strip() for w in groups.get(part.strip(), (part.strip(),))]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not args.workloads or any(w not in WORKLOADS for w in args.workloads):
        p.error(f"--workloads takes a comma list of {', '.join(WORKLOADS)}")
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    for flag, path in (("--datastore", args.datastore), ("--datastore-b", args.datastore_b)):
        if path is not None and not Path(path).is_dir():
            p.error(f"{flag} {path}: no such directory")
    # HF first (the baseline of every speedup), then in SYSTEMS order: the README
    # systems meet the process's one-off costs before the diagnostics do.
    args.systems = [s for s in SYSTEMS if s in args.systems or s == "hf"]
    return args


def encode(session, prompt: BenchPrompt) -> torch.Tensor:
    """Prompt ids, shape (1, L), the same tensor for every system."""
    from retrieval_draft.sessions.session import GenerationRequest

    if prompt.turns:
        messages = [{"role": role, "content": content} for role, content in prompt.turns]
        messages.append({"role": "user", "content": prompt.text})
        ids = session.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        return torch.tensor([list(ids)], dtype=torch.long)
    return session.encode(GenerationRequest(prompt=prompt.text, chat=prompt.chat))


def plugin_kwargs(args: argparse.Namespace) -> dict:
    """Our plugin's options set on the command line (none by default: the README calls keep the defaults)."""
    pairs = (("tree_budget", args.tree_budget), ("max_draft_len", args.max_draft_len))
    return {key: value for key, value in pairs if value is not None}


def make_setup(model, session, args, ids, reference, max_new_tokens, seed, store: str | None = None) -> RunSetup:
    """The shared inputs of one timed run on ``model`` (the model or one of its handles);
    ``store``: the prompt's repo store (repo workloads), drafted from before each ``--datastore``."""
    sampling = {"temperature": args.temperature} if args.sampling else {}
    return RunSetup(
        model, ids, max_new_tokens, sampling, seed, reference, readme_datastore(store, args.datastore),
        session.tokenizer, plugin_kwargs(args), args.history, readme_datastore(store, args.datastore_b),
    )


def warm_up(session, args, ids, systems: list[str]) -> dict:
    """``WARMUP``: one untimed plain HF generate, and one of HF's static cache when it runs (on a GPU
    HF compiles its forward in its first call); none of our systems is warmed up. Returns the
    warm-up calls' wall seconds by system."""
    setup = make_setup(session.model, session, args, ids, None, WARMUP_TOKENS, args.seed)
    return {name: round(run_system(SYSTEMS[name], setup).wall_s, 3)
            for name in ("hf", "hf_compiled") if name == "hf" or name in systems}


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


def bench_prompt(session, args, index: int, prompt: BenchPrompt, ids, systems, handles: ModelHandles):
    """Every system on one prompt, ``args.repeats`` times, interleaved.

    Returns (one record per run, HF's first output of shape (1, L + m)).
    """
    prefill = prefill_seconds(session.model, ids, args.prefill_tries)
    reference_out, first_hf, records, parted = None, None, [], []
    for repeat in range(args.repeats):
        for position, name in enumerate(run_order(systems, repeat, index, not args.sampling)):
            seed = args.seed + 1000 * index + repeat
            reference = None if reference_out is None else reference_out[0].numpy()
            model = handles.get(SYSTEMS[name], prompt.workload, repeat)
            setup = make_setup(model, session, args, ids, reference, args.max_new_tokens, seed, prompt.store)
            result = run_system(SYSTEMS[name], setup)
            if name == "hf" and first_hf is None:
                first_hf = result.output
                reference_out = None if args.sampling else first_hf
            identical = None if args.sampling else bool(torch.equal(result.output, reference_out))
            record = {"workload": prompt.workload, "prompt_id": prompt.prompt_id, "system": name}
            record.update(_timing(result, ids.shape[1], prefill), repeat=repeat, order=position)
            record.update(identical=identical, exact=identical, stats=_stats_dict(result.stats),
                          load_1m=(load_average() or [None])[0])
            records.append(record)
            if identical is False:
                parted.append((record, result.output))
    if parted and session.model.dtype != torch.float32:  # reduced precision: judge by the near-tie rule
        plain = generate_kwargs(SYSTEMS["hf"], make_setup(session.model, session, args, ids, None, args.max_new_tokens, 0))
        verdicts = near_tie_verdicts(session.model, ids, first_hf, [output for _, output in parted], plain)
        for (record, _), verdict in zip(parted, verdicts):
            record.update(verdict)
    return records, first_hf


def _timing(result, prompt_tokens: int, prefill: float) -> dict:
    """New tokens, wall, prefill and decode seconds, decode tokens/s of one run.

    decode = wall - prefill, at least a tenth of the wall: on a busy machine the
    separately measured prefill can exceed a very short call's wall (seen with
    the oracle), which would otherwise give absurd rates.
    """
    new_tokens = int(result.output.shape[1] - prompt_tokens)
    decode = max(result.wall_s - prefill, result.wall_s / 10)
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
        reason = unavailable_reason(SYSTEMS[name], has_datastore, args.sampling, args.history is not None,
                                    args.datastore_b is not None)
        if reason:
            unavailable[name] = reason
    return [s for s in args.systems if s not in unavailable], unavailable


def run(args: argparse.Namespace) -> dict:
    """Load, warm up HF, time every prompt, then the fresh processes; return the result dict (``tools.bench.report``)."""
    torch.set_num_threads(args.threads)
    if args.cache == "fresh":
        with fresh_cache():
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> dict:
    from retrieval_draft.sessions.session import load_session

    session = load_session(args.model)
    session.model.to(device=args.device, dtype=DTYPES[args.dtype])
    if args.prompts_from is not None:
        workloads = read_prompts(args.prompts_from, args.workloads, args.prompts)
    else:
        workloads = build_workloads(args.workloads, args.prompts, args.seed, session.tokenizer)
    runnable, unavailable = select_systems(args, args.datastore is not None)
    prompts = [p for group in workloads.values() for p in group]
    encoded = [encode(session, p).to(args.device) for p in prompts]
    machine = machine_info()
    cache = planning_records(session.model, args.cache)
    started = time.perf_counter()
    warmups = warm_up(session, args, encoded[0], runnable)
    handles = ModelHandles(session.model)
    runs, heads = [], []
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        records, hf_out = bench_prompt(session, args, index, prompt, ids, runnable, handles)
        _progress(prompt, records)
        runs.extend(records)
        heads.append(session.decode_new(ids, hf_out)[:OUTPUT_HEAD_CHARS])
    machine["load_avg_end"] = load_average()
    result = {"machine": machine, "config": run_config(args), "unavailable": unavailable, "cache": cache}
    result["command"] = " ".join(["python", "-m", "tools.bench", *sys.argv[1:]])
    result["labels"] = {name: SYSTEMS[name].label for name in args.systems}
    result["labels"]["hf"] = "HF " + (f"sampling T={args.temperature}" if args.sampling else "greedy") + " generate"
    result["kinds"] = {name: SYSTEMS[name].kind for name in args.systems}
    result["prompts"] = [
        {"workload": p.workload, "prompt_id": p.prompt_id, "chat": p.chat, "prompt_tokens": int(ids.shape[1]),
         "prompt_head": p.text[:OUTPUT_HEAD_CHARS], "hf_output_head": head, "repo_store": p.store}
        for p, ids, head in zip(prompts, encoded, heads)
    ]
    result["warmup_s"] = warmups  # untimed first calls: plain HF, and HF's static cache (its compile on a GPU)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    result["runs"] = runs
    result["planning"] = handles.planning()
    derive(result)
    result["fresh_process"] = fresh_process(args, prompts, encoded)
    return result


def fresh_process(args: argparse.Namespace, prompts: list[BenchPrompt], encoded: list[torch.Tensor]) -> dict:
    """The ``--fresh-process`` measurement (``tools.bench.fresh``), or its status when off."""
    call = readme_call(args.datastore)
    if not args.fresh_process:
        return {"status": "off (--fresh-process to measure)", "call": call, "rows": []}
    started = time.perf_counter()
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    rows = fresh_process_rows(args, prompts, encoded, log)
    return {"status": "measured", "call": call, "rows": rows, "ratio_geomean": fresh_geomean(rows),
            "elapsed_s": round(time.perf_counter() - started, 1)}


def run_config(args: argparse.Namespace) -> dict:
    """The settings of this run, for the report."""
    from retrieval_draft.model.models import default_model_path

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
        "device": args.device,
        "dtype": args.dtype,
        "prompts_from": str(args.prompts_from) if args.prompts_from else None,
        "quick": args.quick,
        "fresh_process": args.fresh_process,
        "prefill_tries": args.prefill_tries,
        "warm_up": WARMUP,
        "model_handles": "each of our systems calls generate on its own model handle per workload and repeat",
        "datastore": args.datastore,
        "datastore_status": _datastore_status(args),
        "datastore_b": args.datastore_b,
        "history": str(args.history) if args.history else None,
        "plugin_kwargs": plugin_kwargs(args),
        "plugin_defaults": plugin_defaults(),
        "code": code_version(),
    }


def _datastore_status(args: argparse.Namespace) -> str:
    """How the datastore systems pass the store, in words."""
    if not args.datastore:
        return "no datastore given"
    repo = [w for w in args.workloads if w in REPO_WORKLOADS]
    return "passed as datastore=PATH" + (f"; {', '.join(repo)}: datastore=[repo store, PATH]" if repo else "")


def plugin_defaults() -> dict:
    """Our plugin's simple keyword defaults (tree_budget, max_draft_len, ...), as this checkout has them."""
    import inspect

    from retrieval_draft.plugin.hf import generate as plugin_generate

    simple = (bool, int, float, str)
    params = inspect.signature(plugin_generate).parameters.values()
    return {p.name: p.default for p in params if isinstance(p.default, simple) and p.name != "synced_gpus"}


def code_version() -> dict:
    """The git commit of this checkout and how many files differ from it."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    except OSError:
        return {"commit": None, "changed_files": None}
    return {"commit": commit or None, "changed_files": len(status.splitlines())}


def save_workloads(args: argparse.Namespace) -> int:
    """``--save-prompts``: build the selected workloads' prompts and write them (no timing)."""
    from retrieval_draft.model.models import load_tokenizer

    tokenizer = load_tokenizer(args.model) if set(args.workloads) & set(REPO_WORKLOADS) else None
    workloads = build_workloads(args.workloads, args.prompts, args.seed, tokenizer)
    save_prompts(args.save_prompts, workloads)
    print(f"wrote {sum(map(len, workloads.values()))} prompts of {', '.join(workloads)} to {args.save_prompts}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the markdown report; write JSON / PNG / markdown when asked."""
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.save_prompts is not None:
        return save_workloads(args)
    result = run(args)
    report = markdown(result)
    print(report)
    if args.markdown:
        atomic_write_bytes(Path(args.markdown), report.encode("utf-8"))
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps(result, indent=1) + "\n").encode("utf-8"))
    if args.png:
        plot(result, args.png)
    exact = [r["exact"] for r in result["runs"] if r["exact"] is not None]
    fresh = result["fresh_process"]["rows"]
    fresh_ok = all(row["ratio"] is not None and row["identical"] is not False for row in fresh)
    return 0 if all(exact) and fresh_ok else 1


if __name__ == "__main__":
    sys.exit(main())
