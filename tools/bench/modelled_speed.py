"""Drafting systems compared with each forward priced by a measured table instead of the clock.

    python -m tools.bench.modelled_speed [--model smollm2-135m] [--workloads chat,qa,rag,multiturn]
        [--prompts 4] [--max-new-tokens 96] [--systems ours,suffix] [--contexts 64,1200]
        [--sizes 1,2,3,4,6,8,12,16,24,32] [--table EARLIER.json] [--json PATH] [--markdown PATH]

The 2-core machines here change speed by up to 40% between processes, more than the gap between
two drafters in one engine that ``tools.bench`` is asked to settle. This tool first times forwards
over k new tokens at two cache lengths (``--contexts``; ``cost_probe.time_chain``, the best of three
rounds of three, interleaved) into a table, ``ForwardTable``, or takes an earlier run's (``--table``:
the table is one snapshot of a noisy machine, so changes are best compared on the same one). Each system then runs the README call over every
prompt with ``draft_planner=`` a ``TablePlanner``: a planner whose cost curve is the table's at the
shorter cache length and which, after each forward, is told the table's time for that forward
(linear in cache length) instead of the clock's. Its corrections by cache length and size
(``ObservedCost``) learn from those times as they would from the clock. So the trees chosen,
hence the steps, follow from the drafts alone, the same in every run on this machine.

    modelled speed-up over HF = HF's modelled time / ours
    HF's:  per generated token, the table's forward over 1 token after the tokens so far
           + HF's host ms per token (measured: ``step_profile.plain_host_ms``)
    ours:  per step, the table's forward over its tree after the tokens so far
           + the host time measured (``DecodeStats.host_s``: drafting, planning, packing,
             readout, accepting)

Prefill is left out of both. What noise remains: the table is one snapshot of the machine (two
runs of the same command fifteen minutes apart timed 8 new tokens after 1,200 cached at 137 and
111 ms), and host time is measured (open chat: 2.7 and 4.6 ms per step in those runs); compare
changes on one table (``--table``) and read host time from ``tools.diagnostics.step_profile``. Each system runs on its own model handle and planner per workload
(rates learned from that workload's earlier prompts only, none from disk); outputs are checked
against HF greedy. This is a model of the forward's time, not a timing: speed claims come from
``tools.bench``; this tool tells whether a change to drafting or planning helps where the timed
runs cannot tell, and by how much on this machine's cost shape.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from retrieval_draft.config import DEFAULTS
from retrieval_draft.planning.cost import VerifyCost
from retrieval_draft.planning.cost_probe import time_chain
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.planning.sizer import extended_cost
from tools.bench.gpu_projection import add_run_arguments, load_run, run_systems, write_report
from tools.bench.run import encode


@dataclass(frozen=True)
class ForwardTable:
    """Forward seconds by new tokens and cache length.

    Attributes:
        sizes: (k,) increasing numbers of new tokens that were timed.
        contexts: (2,) the two cache lengths they were timed after, increasing.
        seconds: (2, k) float, ``seconds[c, i]`` for ``sizes[i]`` tokens after ``contexts[c]``.
    """

    sizes: np.ndarray
    contexts: np.ndarray
    seconds: np.ndarray

    @cached_property
    def curves(self) -> list[VerifyCost]:
        """One cost curve per cache length, built as the plugin builds a measured one."""
        return [VerifyCost.from_points(self.sizes, row, max_nodes=int(self.sizes[-1])) for row in self.seconds]

    def at(self, tokens: int, cache_len: int) -> float:
        """Seconds of one forward over ``tokens`` new tokens after ``cache_len`` cached ones: each
        cache length's curve (past its largest size extended as the planner extends it,
        ``extended_cost``), then linear in the cache length (past either timed length too)."""
        short, long = (float(extended_cost(curve, tokens).seconds[tokens]) for curve in self.curves)
        weight = (cache_len - self.contexts[0]) / (self.contexts[1] - self.contexts[0])
        return float(max(short + weight * (long - short), 1e-6))


def measure_table(model, sizes: list[int], contexts: list[int], rounds: int = 3) -> ForwardTable:
    """Time ``model``'s forwards over random chains of each size after each cache length (the
    tree model's own paths, skinny matmul included); the best of ``rounds`` medians of 3, sizes and
    cache lengths interleaved round by round, so a slow spell of the machine hits them alike."""
    from retrieval_draft.model.tree_model import TreeModel

    rng = np.random.default_rng(0)
    tree_models = []
    for context in contexts:
        tree_model = TreeModel(model)
        tree_model.prefill(torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, context))))
        time_chain(tree_model, 1, rng, 1, 2)  # first forwards: kernel set-up
        tree_models.append(tree_model)
    seconds = np.full((len(contexts), len(sizes)), np.inf)
    for _ in range(rounds):
        for c, tree_model in enumerate(tree_models):
            for i, size in enumerate(sizes):
                seconds[c, i] = min(seconds[c, i], time_chain(tree_model, size, rng, 3, 0))
    return ForwardTable(np.asarray(sizes), np.asarray(contexts), seconds)


def read_table(path: Path) -> ForwardTable:
    """The table of an earlier run's JSON (``--json``), to compare changes on one cost shape."""
    body = json.loads(path.read_text())["table"]
    return ForwardTable(np.asarray(body["sizes"]), np.asarray(body["contexts"]), np.asarray(body["seconds"], float))


class TablePlanner(TreePlanner):
    """A planner that is told ``table``'s time for each forward instead of the clock's, and adds
    those times up (``modelled_s``); its curve is the table's at the shorter cache length."""

    def __init__(self, table: ForwardTable, tree_budget: int = DEFAULTS.tree_budget) -> None:
        super().__init__(tree_budget=tree_budget, cost=table.curves[0])
        self.table = table
        self.modelled_s = 0.0

    def observe_forward(self, rows: int, tokens: int, seconds: float, cache_len: int = 0, plan=None) -> None:
        modelled = self.table.at(tokens, cache_len)
        self.modelled_s += modelled
        super().observe_forward(rows, tokens, modelled, cache_len, plan)


def hf_modelled_s(table: ForwardTable, prompts: list[torch.Tensor], outputs: list[torch.Tensor], host_ms: float) -> float:
    """Plain greedy's modelled decode time: a 1-token forward after each generated token's
    context, plus ``host_ms`` per token."""
    total = 0.0
    for ids, out in zip(prompts, outputs):
        for cache_len in range(ids.shape[1], out.shape[1]):
            total += table.at(1, cache_len) + host_ms / 1000
    return total


def measure(session, workloads: dict, max_new_tokens: int, systems: list[str], table: ForwardTable) -> dict:
    """Per workload: HF's modelled seconds and per system its figures and modelled speed-up."""
    results = {}
    for name, group in workloads.items():
        prompts = [encode(session, p) for p in group]
        hf_host, plain, ran = run_systems(session, prompts, max_new_tokens, systems, lambda: TablePlanner(table))
        hf_s = hf_modelled_s(table, prompts, plain, hf_host)
        rows = {}
        for system, (row, planner) in ran.items():
            row["modelled_s"] = round(planner.modelled_s + row["host_ms"] * row["forwards"] / 1000, 4)
            row["speedup"] = round(hf_s / row["modelled_s"], 3)
            rows[system] = row
        if {"ours", "suffix"} <= set(rows):
            rows["ours_over_suffix"] = round(rows["ours"]["speedup"] / rows["suffix"]["speedup"], 3)
        results[name] = {"hf_host_ms": hf_host, "hf_modelled_s": round(hf_s, 4), "systems": rows}
        print(f"[modelled_speed] {name}: {json.dumps(rows)}", flush=True)
    return results


def markdown(table: ForwardTable, results: dict) -> str:
    """The forward table, then one row per workload and system."""
    lines = ["| cached tokens | " + " | ".join(f"{size} new" for size in table.sizes) + " |",
             "|---:|" + "---:|" * len(table.sizes)]
    for context, row in zip(table.contexts, table.seconds):
        lines.append(f"| {context} | " + " | ".join(f"{1000 * s:.1f} ms" for s in row) + " |")
    lines += ["", "| workload | system | modelled speed-up over HF | accepted/step | nodes/step | host ms/step | "
              "HF host ms/token | identical |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, entry in results.items():
        for system in [s for s in ("ours", "suffix") if s in entry["systems"]]:
            r = entry["systems"][system]
            lines.append(f"| {name} | {system} | {r['speedup']:.3f}x | {r['mat']:.2f} | {r['nodes_per_step']:.1f} | "
                         f"{r['host_ms']:.2f} | {entry['hf_host_ms']:.2f} | {'yes' if r['identical'] else 'NO'} |")
        ratio = entry["systems"].get("ours_over_suffix")
        if ratio:
            lines.append(f"| {name} | ours / suffix | {ratio:.3f} | | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(p, "chat,qa,rag,multiturn")
    p.add_argument("--contexts", default="64,1200", help="the two cache lengths the table is timed after")
    p.add_argument("--sizes", default="1,2,3,4,6,8,12,16,24,32", help="new tokens per timed forward")
    p.add_argument("--table", type=Path, help="take the forward table from an earlier run's JSON instead of timing one")
    args = p.parse_args(argv)
    try:
        contexts = [int(c) for c in args.contexts.split(",")]
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error("--contexts and --sizes take comma lists of integers")
    if len(contexts) != 2 or not 0 < contexts[0] < contexts[1]:
        p.error("--contexts takes two increasing positive cache lengths")
    if len(sizes) < 2 or sizes[0] != 1 or any(b <= a for a, b in zip(sizes, sizes[1:])):
        p.error("--sizes takes increasing sizes starting at 1")
    if args.table is not None and not args.table.is_file():
        p.error(f"--table: no such file {args.table}")
    session, workloads, systems = load_run(p, args)
    table = read_table(args.table) if args.table else measure_table(session.model, sizes, contexts)
    results = measure(session, workloads, args.max_new_tokens, systems, table)
    body = {"table": {"sizes": table.sizes.tolist(), "contexts": table.contexts.tolist(),
                      "seconds": table.seconds.tolist()}, "results": results}
    write_report(args, "tools.bench.modelled_speed", argv, markdown(table, results), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
