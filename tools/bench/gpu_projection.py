"""What our drafts would give on a GPU, projected from parts measured on this CPU.

    python -m tools.bench.gpu_projection [--model smollm2-135m] [--workloads code_raw,grounded,chat]
        [--prompts 4] [--max-new-tokens 96] [--forward-ms 8,25] [--systems ours,suffix] [--fixed]
        [--sampling] [--json PATH] [--markdown PATH]

A GPU runs one forward over a small batch's tree in about the same time for 1 or 64 nodes. So
each system here runs the README call with ``draft_planner=`` a planner whose cost curve is flat
up to 64 nodes (and never corrected by this CPU's forward times): the tree sizes a GPU's planner
would choose. Measured per workload: accepted tokens per step (MAT), nodes per step, and our host
ms per step outside the forward (``DecodeStats.host_s``), and beside them plain HF greedy's host
ms per token on the same prompts (wall minus the time inside the forward). The projection:

    speed-up over HF = MAT x (T + HF host) / (T + our host)

for each forward time T. Assumptions: the forward costs T whatever the tree size up to 64 nodes;
host work costs on the GPU machine what it costs here; the projected host time is taken both as
measured and without the readout phase, which on a GPU runs on the device (argmax and the
recycling table's top-k over every node) with one host read (so the truth lies between, nearer
the second). Systems: ``ours`` (the default drafters) and ``suffix`` (SuffixDecoding as a drafter
in our engine, ``tools.bench.peers``), each on its own model handle and planner per workload, so
each learns from that workload's earlier prompts only. Outputs are checked against HF's.

``--fixed`` verifies fixed 64-node trees instead (the README call with ``adaptive_tree=False,
tree_budget=64``: every step's tree holds the 64 most probable candidates, what the published
training-free methods compare at on a GPU), for accepted tokens per step at that size.
``--sampling`` samples at temperature 0.7, top-p 0.9 (``SAMPLING``, seeded per call) instead of
greedy: the same trees verified by lossless speculative sampling, so MAT is what sampling keeps;
outputs are then not compared (a sample is not HF's sample; the distribution tests check them).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import retrieval_draft
from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.planning.cost import VerifyCost
from retrieval_draft.planning.planner import TreePlanner
from tools.bench import peers
from tools.bench.run import encode
from tools.bench.workloads import WORKLOADS, build_workloads
from tools.diagnostics.replay import UnobservedCost
from tools.diagnostics.step_profile import plain_host_ms

FLAT_NODES = 64
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.9}


def flat_planner(forward_s: float) -> TreePlanner:
    """A planner that believes every tree up to ``FLAT_NODES`` nodes costs one ``forward_s`` forward."""
    return TreePlanner(tree_budget=FLAT_NODES, cost=VerifyCost(np.full(FLAT_NODES + 1, forward_s)),
                       observed=UnobservedCost())


def run_system(model, prompts: list[torch.Tensor], max_new_tokens: int, drafters, planner: TreePlanner | None,
               sampling: bool = False) -> dict:
    """The README call with ``draft_planner=planner`` (None: fixed ``FLAT_NODES``-node trees) over
    ``prompts`` on one handle, greedy or (``sampling``) with ``SAMPLING`` seeded per call; totals and outputs."""
    trees = {"adaptive_tree": False, "tree_budget": FLAT_NODES} if planner is None else {"draft_planner": planner}
    total, outputs = DecodeStats(), []
    for ids in prompts:
        stats = DecodeStats()
        extra = {"drafters": drafters} if drafters is not None else {}
        extra.update(SAMPLING if sampling else {"do_sample": False})
        torch.manual_seed(0)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             custom_generate=retrieval_draft.generate, draft_stats=stats, **trees, **extra)
        outputs.append(out)
        for name in ("forwards", "steps", "step_tokens", "tree_nodes", "readout_s", "draft_s", "plan_s", "pack_s",
                     "forward_s", "accept_s", "device_forward_s"):
            setattr(total, name, getattr(total, name) + getattr(stats, name))
    steps = max(total.forwards, 1)
    return {"mat": round(total.step_tokens / steps, 3), "nodes_per_step": round(total.tree_nodes / steps, 2),
            "forwards": total.forwards,
            "host_ms": round(1000 * total.host_s / steps, 3),
            "host_without_readout_ms": round(1000 * (total.host_s - total.readout_s) / steps, 3),
            "outputs": outputs}


def project(row: dict, hf_host_ms: float, forward_ms: list[float]) -> dict:
    """Projected speed-ups over HF for each forward time, host as measured and without the readout."""
    out = {}
    for t in forward_ms:
        out[f"T={t:g}ms"] = round(row["mat"] * (t + hf_host_ms) / (t + row["host_ms"]), 3)
        out[f"T={t:g}ms, readout on the device"] = round(
            row["mat"] * (t + hf_host_ms) / (t + row["host_without_readout_ms"]), 3)
    return out


def run_systems(session, prompts: list[torch.Tensor], max_new_tokens: int, systems: list[str], make_planner,
                sampling: bool = False) -> tuple[float, list[torch.Tensor], dict]:
    """Plain HF greedy over ``prompts`` (its host ms per token), then each system (``ours``,
    ``suffix``) on its own model handle (its own plugin memory, as tools.bench keeps it) with the
    planner ``make_planner()`` gives: (HF host ms, HF's outputs, {system: (run_system's row with
    ``identical`` set, the planner)}). Greedy outputs are compared with HF's; a sample with nothing."""
    hf_host, _, plain = plain_host_ms(session.model, prompts, max_new_tokens)
    rows = {}
    for system in systems:
        drafters = [peers.SuffixDecodingDrafter(peers.suffix_cache_class())] if system == "suffix" else None
        planner = make_planner()
        row = run_system(copy.copy(session.model), prompts, max_new_tokens, drafters, planner, sampling)
        outputs = row.pop("outputs")
        row["identical"] = None if sampling else all(torch.equal(a, b) for a, b in zip(outputs, plain))
        rows[system] = (row, planner)
    return hf_host, plain, rows


def measure(session, workloads: dict, max_new_tokens: int, forward_ms: list[float], systems: list[str],
            fixed: bool = False, sampling: bool = False) -> dict:
    """Per workload: HF's host ms per token, and per system (``ours``, ``suffix``) its figures and projections."""
    table = {}
    for name, group in workloads.items():
        prompts = [encode(session, p) for p in group]
        started = time.perf_counter()
        hf_host, _, ran = run_systems(session, prompts, max_new_tokens, systems,
                                      lambda: None if fixed else flat_planner(forward_ms[0] / 1000), sampling)
        rows = {system: {**row, **project(row, hf_host, forward_ms)} for system, (row, _) in ran.items()}
        if {"ours", "suffix"} <= set(rows):
            rows["ours_over_suffix"] = {key: round(rows["ours"][key] / rows["suffix"][key], 3)
                                        for key in rows["ours"] if key.startswith("T=")}
        table[name] = {"hf_host_ms": hf_host, "systems": rows, "seconds": round(time.perf_counter() - started, 1)}
        print(f"[gpu_projection] {name}: {json.dumps(rows)}", flush=True)
    return table


def markdown(table: dict, forward_ms: list[float]) -> str:
    """One row per workload and system."""
    keys = [f"T={t:g}ms" for t in forward_ms] + [f"T={t:g}ms, readout on the device" for t in forward_ms]
    lines = ["| workload | system | MAT | nodes/step | host ms/step | host w/o readout | HF host ms/token | "
             + " | ".join(keys) + " | identical |", "|---|---|" + "---:|" * (5 + len(keys)) + "---|"]
    for name, entry in table.items():
        for system in [system for system in ("ours", "suffix") if system in entry["systems"]]:
            r = entry["systems"][system]
            lines.append(f"| {name} | {system} | {r['mat']:.2f} | {r['nodes_per_step']:.1f} | {r['host_ms']:.2f} | "
                         f"{r['host_without_readout_ms']:.2f} | {entry['hf_host_ms']:.2f} | "
                         + " | ".join(f"{r[k]:.2f}x" for k in keys) + f" | {_identical(r['identical'])} |")
        ratio = entry["systems"].get("ours_over_suffix")
        if ratio:
            lines.append(f"| {name} | ours / suffix | | | | | | " + " | ".join(f"{ratio[k]:.2f}x" for k in keys) + " | |")
    systems = {system for entry in table.values() for system in entry["systems"] if system in ("ours", "suffix")}
    for system in sorted(systems):  # overall MAT: all steps of all workloads
        tokens = sum(e["systems"][system]["mat"] * e["systems"][system]["forwards"] for e in table.values())
        steps = sum(e["systems"][system]["forwards"] for e in table.values())
        lines.append(f"| overall | {system} | {tokens / max(steps, 1):.2f} | | | | | " + " | " * len(keys) + " |")
    return "\n".join(lines)


def _identical(identical: bool | None) -> str:
    return "n/a (sampling)" if identical is None else ("yes" if identical else "NO")


def add_run_arguments(p: argparse.ArgumentParser, workloads: str) -> None:
    """The arguments this harness shares with ``modelled_speed``: model, prompts, systems, outputs."""
    p.add_argument("--model", default=None, help="local model or a name of the benchmark's (default SmolLM2-135M)")
    p.add_argument("--workloads", default=workloads)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--systems", default="ours,suffix", help="comma list of ours, suffix")
    p.add_argument("--json")
    p.add_argument("--markdown")


def load_run(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple:
    """``add_run_arguments``' values checked (a usage error for bad ones, before the model loads),
    then the session, its workloads' prompts and the systems: (session, workloads, systems)."""
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not names or any(w not in WORKLOADS for w in names):
        p.error(f"--workloads takes a comma list of {', '.join(WORKLOADS)}")
    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    if not systems or not set(systems) <= {"ours", "suffix"}:
        p.error("--systems takes a comma list of ours, suffix")
    reason = peers.unavailable() if "suffix" in systems else None
    if reason:
        p.error(f"SuffixDecoding is unavailable: {reason}")
    from retrieval_draft.sessions.session import load_session

    torch.set_num_threads(2)
    session = load_session(args.model)
    return session, build_workloads(names, args.prompts, seed=0, tokenizer=session.tokenizer), systems


def write_report(args: argparse.Namespace, module: str, argv: list[str] | None, report: str, body: dict) -> None:
    """Print ``report``; write it (``--markdown``) and ``body`` (``--json``) with the command that made them."""
    print(report)
    command = " ".join([f"python -m {module}", *(argv if argv is not None else sys.argv[1:])])
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps({"command": command, **body}, indent=1) + "\n").encode())
    if args.markdown:
        atomic_write_bytes(Path(args.markdown), f"`{command}`\n\n{report}\n".encode())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(p, "code_raw,grounded,chat")
    p.add_argument("--forward-ms", default="8,25", help="forward times T to project for, ms (the first sizes the planner)")
    p.add_argument("--fixed", action="store_true", help="verify fixed 64-node trees (adaptive_tree=False, tree_budget=64)")
    p.add_argument("--sampling", action="store_true", help="sample at temperature 0.7, top-p 0.9 instead of greedy")
    args = p.parse_args(argv)
    try:
        forward_ms = [float(t) for t in args.forward_ms.split(",")]
    except ValueError:
        p.error("--forward-ms takes a comma list of milliseconds")
    session, workloads, systems = load_run(p, args)
    table = measure(session, workloads, args.max_new_tokens, forward_ms, systems, args.fixed, args.sampling)
    write_report(args, "tools.bench.gpu_projection", argv, markdown(table, forward_ms), {"table": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
