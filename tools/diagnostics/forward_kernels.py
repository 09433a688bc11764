"""What a tree forward runs that a lone root's does not: operators or GPU kernels, counted and timed.

    python -m tools.diagnostics.forward_kernels [--device cuda] [--dtype bfloat16] [--shape 135m]
                                                [--sizes 1,2,4,16] [--cache-len 256] [--repeats 10] [--json PATH]

A randomly initialised Llama of ``--shape`` (``tools.gpu_check.LLAMA_SHAPES``: 135m is SmolLM2-135M's,
cost does not depend on trained weights; ``tiny`` the 2-layer model of ``step_profile``) runs, through
``TreeModel``, one forward per tree size after ``--cache-len`` cached tokens: a lone root (size 1, the
path plain decoding takes: no mask) and trees of a root with ``k - 1`` children (our mask, grouped
tree attention). Per size: the median wall ms of ``--repeats`` forwards (synchronised on a GPU),
the cost probe's own timing of a chain of that size (``cost_probe.time_chain``: CUDA events on a
GPU), then one forward under ``torch.profiler``: on a GPU its kernels (count, and device ms by name), on a
CPU its leaf operators. The last table names what each tree size runs more of than the lone root.
On a launch-bound GPU (the H100 VM of 2026-11-26: 61 ms for a lone root of the 135m shape in
bfloat16, 77 for two tokens) those extra launches are what a tree costs. ``--decode-tokens N`` adds
the same sizes inside decoding (``in_decoding``: fixed trees through the README call), for the
question that VM's benchmark left (trees of 2-7 nodes took 2.3-2.9 lone roots' time inside decoding,
alone no more than one).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.model.tree_model import TreeModel
from retrieval_draft.planning.cost_probe import time_chain
from retrieval_draft.planning.timing import synchronize
from retrieval_draft.tree import DraftTree
from tools.diagnostics.step_profile import ours, tiny_model
from tools.gpu_check import DTYPES, LLAMA_SHAPES

VIEWS = {  # operators that launch nothing: not counted on a CPU
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view", "aten::as_strided", "aten::t",
    "aten::transpose", "aten::expand", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze",
    "aten::permute", "aten::unbind", "aten::split", "aten::narrow", "aten::detach", "aten::alias", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::result_type", "aten::view_as", "aten::flatten", "aten::chunk", "aten::contiguous", "aten::size",
    "aten::stride", "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero",
}


def root_with_children(size: int, vocab: int, rng: np.random.Generator) -> DraftTree:
    """A tree of ``size`` nodes: the root and ``size - 1`` children (the widest tree of that size)."""
    parents = np.array([-1] + [0] * (size - 1))
    return DraftTree(tokens=rng.integers(3, vocab, size=size), parents=parents,
                     depths=np.minimum(np.arange(size), 1), probs=np.ones(size))


def launched(prof, cuda: bool) -> Counter:
    """Kernel names (GPU) or leaf operator names (CPU) of one profiled forward, with counts."""
    counts: Counter = Counter()
    for event in prof.events():
        if cuda:
            if event.device_type == torch.autograd.DeviceType.CUDA:
                counts[event.name] += 1
        elif event.name.startswith("aten::") and event.name not in VIEWS and not any(
            child.name.startswith("aten::") for child in event.cpu_children
        ):
            counts[event.name] += 1
    return counts


def device_ms_by_name(averages, counts: Counter) -> dict:
    """Device ms per kernel named in ``counts``, from ``profile.key_averages()`` (``FunctionEventAvg``
    rows, named by ``key``; their times are in microseconds)."""
    return {item.key: round(getattr(item, "self_device_time_total", 0.0) / 1000.0, 4)
            for item in averages if item.key in counts}


def measure(tree_model: TreeModel, size: int, repeats: int, rng: np.random.Generator) -> dict:
    """Median wall ms of ``repeats`` forwards over a ``size``-node tree (after two untimed), and
    the kernels or operators of one more; the cache is trimmed back after each."""
    device = tree_model.device
    cuda = device.type == "cuda"
    tree = root_with_children(size, tree_model.model.config.vocab_size, rng)
    samples = []
    for index in range(repeats + 2):
        synchronize(device)
        started = time.perf_counter()
        tree_model.score_trees([tree])
        synchronize(device)
        if index >= 2:
            samples.append(time.perf_counter() - started)
        tree_model.keep([np.zeros(1, dtype=np.int64)])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        tree_model.score_trees([tree])
        synchronize(device)
    tree_model.keep([np.zeros(1, dtype=np.int64)])
    chain_ms = 1000 * time_chain(tree_model, size, rng, repeats)
    counts = launched(prof, cuda)
    device_ms = device_ms_by_name(prof.key_averages(), counts) if cuda else {}
    return {"wall_ms": round(1000 * float(np.median(samples)), 3), "probe_chain_ms": round(chain_ms, 3), "launches": sum(counts.values()),
            "by_name": dict(counts.most_common()), "device_ms_by_name": device_ms}


def extra_over_lone_root(table: dict) -> dict:
    """Per tree size, the names it runs more often than the lone root (size 1), with how many more."""
    lone = Counter(table[1]["by_name"])
    return {size: {name: count - lone[name] for name, count in row["by_name"].items() if count > lone[name]}
            for size, row in table.items() if size != 1}


def in_decoding(model, sizes: list[int], cache_len: int, new_tokens: int, rng: np.random.Generator) -> dict:
    """The same tree sizes inside decoding: per size, one README call (``custom_generate``) with
    ``adaptive_tree=False, tree_budget=size - 1`` on a prompt of ``cache_len`` tokens that repeats one
    30-token block (a random model continues it, so drafts fill the trees), after one untimed call.
    Per size: nodes and tokens per step, the forward as the device timed it (``ForwardTimer``: CUDA
    events on a GPU, what the planner's corrections see) and the whole step's wall ms, in ms per step,
    as ``step_profile.ours`` sums them."""
    block = rng.integers(3, model.config.vocab_size, size=30)
    prompt = torch.from_numpy(np.resize(block, cache_len)[None]).to(model.device)
    memory = PluginMemory(persist=False)
    ours(model, [prompt], 8, memory, adaptive_tree=False, tree_budget=max(sizes) - 1)
    out = {}
    for size in sizes:
        row = ours(model, [prompt], new_tokens, memory, adaptive_tree=False, tree_budget=size - 1)
        out[size] = {"nodes_per_step": row["nodes_per_step"], "tokens_per_step": row["tokens_per_step"],
                     "device_forward_ms": row["device_forward"], "step_ms": row["step"], "forwards": row["forwards"]}
    return out


def markdown(table: dict, extra: dict, cuda: bool) -> str:
    unit = "kernels" if cuda else "operators"
    lines = [f"| tree nodes | wall ms | the cost probe's chain, ms | {unit} |", "|---:|---:|---:|---:|"]
    lines += [f"| {size} | {row['wall_ms']:.2f} | {row['probe_chain_ms']:.2f} | {row['launches']} |"
              for size, row in table.items()]
    lines += ["", f"| tree nodes | {unit} more than a lone root's |", "|---:|---|"]
    for size, names in extra.items():
        text = ", ".join(f"{name} +{count}" for name, count in sorted(names.items(), key=lambda kv: -kv[1])[:8])
        lines.append(f"| {size} | {text or 'none'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--shape", default="135m", choices=("tiny", *LLAMA_SHAPES))
    p.add_argument("--sizes", default="1,2,4,16", help="tree sizes in nodes (1, the lone root, is always added)")
    p.add_argument("--cache-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--decode-tokens", type=int, default=0,
                   help="also decode this many tokens per size through the README call (fixed trees) and "
                        "report the forward's time inside decoding (0: skip)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    sizes = sorted({1, *(int(s) for s in args.sizes.split(",") if s.strip())})
    if sizes[0] < 1:
        p.error("--sizes takes positive node counts")
    shape = None if args.shape == "tiny" else LLAMA_SHAPES[args.shape]
    model = tiny_model(shape=shape, device=args.device, dtype=DTYPES[args.dtype])
    rng = np.random.default_rng(0)
    tree_model = TreeModel(model)
    tree_model.prefill(torch.from_numpy(rng.integers(3, model.config.vocab_size, size=(1, args.cache_len))))
    table = {size: measure(tree_model, size, args.repeats, rng) for size in sizes}
    extra = extra_over_lone_root(table)
    cuda = tree_model.device.type == "cuda"
    print(markdown(table, extra, cuda))
    decoding = in_decoding(model, sizes, args.cache_len, args.decode_tokens, rng) if args.decode_tokens > 0 else None
    if decoding is not None:
        print("\n| tree nodes (budget + 1) | nodes/step | tokens/step | forward ms (device's timer) | step ms | "
              "forward ms alone (wall) |\n|---:|---:|---:|---:|---:|---:|")
        for size, row in decoding.items():
            print(f"| {size} | {row['nodes_per_step']} | {row['tokens_per_step']} | {row['device_forward_ms']:.2f} | "
                  f"{row['step_ms']:.2f} | {table[size]['wall_ms']:.2f} |")
    if args.json:
        payload = {"device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": args.dtype, "shape": args.shape,
                   "cache_len": args.cache_len, "by_size": table, "extra_over_lone_root": extra,
                   "in_decoding": decoding}
        atomic_write_bytes(Path(args.json), (json.dumps(payload, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
