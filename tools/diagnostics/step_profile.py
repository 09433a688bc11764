"""Where a decode step's time goes: tree forward (matmuls, attention, the rest) and the loop around it.

    python -m tools.diagnostics.step_profile [--workloads code_raw,grounded,chat] [--prompts 5] [--json PATH]

Decodes the benchmark's prompts greedily with prompt lookup through the
engine, as the plugin does (cost-aware trees, acceptance rates shared by the
calls of the run), and profiles only the tree forwards with cProfile, so the
prompts' prefill is not counted. Per workload it prints, in ms per decode
step: the whole step, the tree forward, its matrix multiplications (MKL's
``linear`` plus the skinny kernel), its attention (SDPA), the rest of the
forward (per-layer Python and HF module code, norms, rotary embedding, logits
copy) and what lies outside the forward (drafting, planning, verification,
KV compaction). cProfile's own overhead inflates the "rest" column somewhat;
speed claims come from ``python -m tools.bench``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path

import torch

from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.config import DraftConfig
from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.drafters.registry import DraftSources, make_drafters
from retrieval_draft.hf import make_planner
from retrieval_draft.model.tree_model import TreeModel
from tools.bench.workloads import WORKLOADS, build_workloads

# (column, cProfile function name): the leaf calls that a tree forward's matmuls and attention end in.
MATMUL_CALLS = ("<built-in method torch._C._nn.linear>", "skinny_matmul")
ATTENTION_CALLS = ("<built-in method torch._C._nn.scaled_dot_product_attention>",)


class ProfiledTreeModel(TreeModel):
    """A ``TreeModel`` whose tree forwards run under ``profiler`` and add their wall time to ``forward_s``."""

    def __init__(self, model, profiler: cProfile.Profile, skinny_sizes=None) -> None:
        super().__init__(model, skinny_sizes=skinny_sizes)
        self.profiler = profiler
        self.forward_s = 0.0

    def score_trees(self, trees):
        started = time.perf_counter()
        self.profiler.enable()
        try:
            return super().score_trees(trees)
        finally:
            self.profiler.disable()
            self.forward_s += time.perf_counter() - started


def own_time(profiler: cProfile.Profile, names: tuple[str, ...]) -> tuple[float, int]:
    """(seconds spent inside the functions called ``names``, their own time; number of calls)."""
    entries = [entry for (_, _, name), entry in pstats.Stats(profiler).stats.items() if name in names]
    return float(sum(entry[2] for entry in entries)), int(sum(entry[1] for entry in entries))


def profile_prompts(model, prompts: list[torch.Tensor], max_new_tokens: int) -> dict:
    """Decode ``prompts`` (each shape (1, L)) and split the decode steps' time; ms per step.

    Returns steps, mean tree nodes, matmul calls per step, and ms per step for ``step``, ``forward``,
    ``matmul``, ``attention``, ``forward_rest`` and ``outside_forward``.
    """
    # default tree budget, cost-aware; fresh rates shared by this run's calls only
    planner = make_planner(model, DraftConfig(adaptive_tree=True, draft_learning=False), sampling=False)
    profiler = cProfile.Profile()
    steps = nodes = 0
    decode_s = forward_s = 0.0
    for ids in prompts:
        tree_model = ProfiledTreeModel(model, profiler, skinny_sizes=planner.cost.skinny_sizes)
        options = DecodeOptions(max_new_tokens=max_new_tokens, eos_ids=frozenset(_eos_ids(model)))
        drafters = make_drafters(["prompt"], DraftSources())
        _, stats = speculative_decode(tree_model, ids, [drafters], options, planner=planner)
        steps += stats.steps
        nodes += stats.tree_nodes
        decode_s += stats.decode_s
        forward_s += tree_model.forward_s  # prefill runs through prefill(), not score_trees()
    matmul, matmul_calls = own_time(profiler, MATMUL_CALLS)
    attention, _ = own_time(profiler, ATTENTION_CALLS)
    per_step = lambda seconds: round(1000 * seconds / max(steps, 1), 2)  # noqa: E731
    return {
        "steps": steps,
        "mean_tree_nodes": round(nodes / max(steps, 1), 2),
        "matmuls_per_step": round(matmul_calls / max(steps, 1), 2),
        "step": per_step(decode_s),
        "forward": per_step(forward_s),
        "matmul": per_step(matmul),
        "attention": per_step(attention),
        "forward_rest": per_step(forward_s - matmul - attention),
        "outside_forward": per_step(decode_s - forward_s),
    }


def _eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def markdown(table: dict) -> str:
    columns = ("step", "forward", "matmul", "attention", "forward_rest", "outside_forward")
    lines = ["| workload | steps | nodes/tree | " + " | ".join(f"{c} ms" for c in columns) + " |",
             "|---|---:|---:|" + "---:|" * len(columns)]
    for workload, row in table.items():
        lines.append(f"| {workload} | {row['steps']} | {row['mean_tree_nodes']} | "
                     + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="code_raw,grounded,chat", help=f"comma list of {','.join(WORKLOADS)}")
    p.add_argument("--prompts", type=int, default=5, help="prompts per workload")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--model", default=None, help="local model directory or .gguf (default SmolLM2-135M)")
    p.add_argument("--json", help="write the table as JSON here")
    args = p.parse_args(argv)
    from retrieval_draft.session import GenerationRequest, load_session

    session = load_session(args.model)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not names or any(w not in WORKLOADS for w in names):
        p.error(f"--workloads takes a comma list of {', '.join(WORKLOADS)}")
    workloads = build_workloads(names, args.prompts, seed=0)
    encode = lambda prompt: session.encode(GenerationRequest(prompt=prompt.text, chat=prompt.chat))  # noqa: E731
    profile_prompts(session.model, [encode(workloads[names[0]][0])], 8)  # warm-up: cost curve, kernel compile
    table = {name: profile_prompts(session.model, [encode(q) for q in group], args.max_new_tokens)
             for name, group in workloads.items()}
    print(markdown(table))
    if args.json:
        payload = {"threads": torch.get_num_threads(), "ms_per_step": table}
        atomic_write_bytes(Path(args.json), (json.dumps(payload, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
