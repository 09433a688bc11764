"""Forward cost of tree verification with the CPU paths switched on one by one.

    python -m tools.diagnostics.forward_cost [--contexts 256,1500] [--sizes 1,2,4,8,16] [--json PATH]

For each context length, times ``TreeModel.score_trees`` over a k-token chain
under four variants, interleaved round by round in one process:
``stock`` (HF's concatenating cache, HF's SDPA, MKL), ``+kv_cache`` (in-place
cache), ``+attention`` (also grouped-query tree attention) and ``all`` (also
the skinny matmul at every size in ``SKINNY_ROWS``). Then it times SmolLM2's
own ``nn.Linear`` layers alone, MKL against the skinny kernel, by row count.
Prints markdown tables (median ms, best round) and optionally writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache

from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.planning.cost_probe import time_chain
from retrieval_draft.model.models import load_model
from retrieval_draft.model.skinny_linear import SKINNY_ROWS, eligible_linears, skinny_linear
from retrieval_draft.model.tree_model import TreeModel

VARIANTS = ("stock", "+kv_cache", "+attention", "all")


def _csv_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def prepared(model, prompt: torch.Tensor, variant: str) -> TreeModel:
    """A TreeModel after ``prompt``, with the variant's paths switched off."""
    tree_model = TreeModel(model)
    tree_model.prefill(prompt)
    if variant == "stock":  # the same rows in HF's own concatenating cache
        stock = DynamicCache()
        for index, layer in enumerate(tree_model.cache.layers):
            stock.update(layer.keys.clone(), layer.values.clone(), index)
        tree_model.cache = stock
    if variant in ("stock", "+kv_cache"):
        tree_model.grouped_attention = False
    if variant != "all":
        tree_model.skinny_sizes = frozenset()
    return tree_model


def forward_table(model, contexts, sizes, rounds, runs) -> dict:
    """{context: {variant: {k: best-of-rounds median ms}}}; each median over ``runs`` forwards after two warm-ups."""
    rng = np.random.default_rng(0)
    result = {}
    for context in contexts:
        prompt = torch.from_numpy(rng.integers(0, model.config.vocab_size, size=(1, context)))
        table = {variant: {size: float("inf") for size in sizes} for variant in VARIANTS}
        for _ in range(rounds):
            for variant in VARIANTS:
                tree_model = prepared(model, prompt, variant)
                for size in sizes:
                    table[variant][size] = min(table[variant][size], time_chain(tree_model, size, rng, runs, warmups=2) * 1000)
        result[context] = table
    return result


@torch.no_grad()
def matmul_table(model, rows_list, runs) -> dict:
    """{rows: {"mkl": ms, "kernel": ms}}: all eligible Linear layers once, median of ``runs``."""
    linears = eligible_linears(model)
    result = {}
    for rows in rows_list:
        inputs = {m.in_features: torch.randn(1, rows, m.in_features) for m in linears}
        timings = {}
        for name, apply in (("mkl", lambda m, x: m(x)), ("kernel", skinny_linear)):
            samples = []
            for run in range(runs + 1):
                started = time.perf_counter()
                for module in linears:
                    apply(module, inputs[module.in_features])
                if run:
                    samples.append(time.perf_counter() - started)
            timings[name] = float(np.median(samples) * 1000)
        result[rows] = timings
    return result


def markdown(forward: dict, matmul: dict, sizes: list[int]) -> str:
    lines = ["| cache tokens | variant | " + " | ".join(f"k={k}" for k in sizes) + " |",
             "|---|---|" + "---:|" * len(sizes)]
    for context, table in forward.items():
        for variant in VARIANTS:
            lines.append(f"| {context} | {variant} | " + " | ".join(f"{table[variant][k]:.1f}" for k in sizes) + " |")
    lines += ["", "| rows | MKL ms | skinny kernel ms |", "|---:|---:|---:|"]
    lines += [f"| {rows} | {t['mkl']:.1f} | {t['kernel']:.1f} |" for rows, t in matmul.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="local model directory or .gguf (default SmolLM2-135M)")
    p.add_argument("--contexts", type=_csv_ints, default=[256, 1500], help="cache lengths in tokens")
    p.add_argument("--sizes", type=_csv_ints, default=[1, 2, 4, 8, 16], help="new tokens per forward")
    p.add_argument("--matmul-rows", type=_csv_ints, default=[1, 2, 3, 4, 8, 16, 32])
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best median is kept")
    p.add_argument("--runs", type=int, default=8, help="timed forwards per median")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", help="write the tables as JSON here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    forward = forward_table(model, args.contexts, args.sizes, args.rounds, args.runs)
    matmul = matmul_table(model, args.matmul_rows, args.runs)
    print(markdown(forward, matmul, args.sizes))
    if args.json:
        payload = {"threads": torch.get_num_threads(), "forward_ms": forward, "matmul_ms": matmul,
                   "skinny_rows": list(SKINNY_ROWS)}
        atomic_write_bytes(Path(args.json), (json.dumps(payload, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
