"""Self-speculation by layer skipping, measured: would drafting with the target's own first
layers (a subset of its layers, the same weights) pay?

    python -m tools.diagnostics.layer_skip [--search-prompts 1] [--eval-prompts 1] [--tokens 96] [--context 256]
                               [--max-skip 0.6] [--json PATH] [--markdown PATH]

1. Greedy reference outputs of the full model on benchmark prompts (a mix of
   code, grounded edits, chat and general-text workloads).
2. Greedy layer removal (as llama.cpp's layer-skip experiments did with
   perplexity, here with acceptance): starting from all layers, remove the layer
   whose absence keeps the highest top-1 agreement with the full model on the
   search prompts' reference outputs, and repeat up to ``--max-skip`` of the layers.
3. On separate evaluation prompts, for each skipped fraction: top-1 agreement
   and the exact tokens per step of greedy self-speculation with a chain of k
   drafted tokens. Agreement is with the full model's own teacher-forced top-1
   on the same input (the prompt cropped to its last ``--context`` tokens, then
   the reference output). Teacher forcing is exact for the walk where the full
   model's predictions are the reference (uncropped prompts): while a chain's
   drafts match, the draft model's input is the reference prefix, so the run of
   consecutive matches from a position is the number of drafts a k-chain gets
   accepted there (capped at k), plus the bonus token; with a cropped prompt
   it is an estimate.
4. Speed: tokens per step times the plain step time, over k draft steps of the
   skipping model (timed here with a KV cache) plus one verification of k + 1
   tokens (the measured CPU cost curve). ``gpu_on_paper`` assumes a flat
   verification cost up to 16 tokens (one step) and a draft step costing its
   share of layers plus the lm_head, as on a GPU where a small model is bound by
   per-layer latency.

Prints a markdown report; ``--json`` writes every number.
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
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.model.attention_layout import attention_layout
from tools.bench.run import encode
from tools.bench.workloads import build_workloads

SEARCH_WORKLOADS = ("code_chat", "grounded", "chat", "summarize")
EVAL_WORKLOADS = ("code_raw", "code_chat", "grounded", "chat", "qa", "summarize", "rag", "translate")
CHAINS = (1, 2, 3, 4, 6)


class SkippedLayers:
    """Context manager: the model runs with only the decoder layers in ``keep`` (indices, in order)."""

    def __init__(self, model: torch.nn.Module, keep: list[int]) -> None:
        self.model, self.keep = model, keep

    def __enter__(self):
        inner = self.model.model
        self.saved = inner.layers
        inner.layers = torch.nn.ModuleList([self.saved[i] for i in self.keep])
        return self.model

    def __exit__(self, *exc) -> None:
        self.model.model.layers = self.saved


def reference(model, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    """The full model's greedy sequence after ``ids`` (shape (1, L + m))."""
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False)


def predictions(model, keep: list[int], sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """(m,) the model's teacher-forced top-1 after each prefix ending in the last prompt token
    and the generated ones, with only the layers in ``keep``."""
    with SkippedLayers(model, keep), torch.no_grad():
        return model(sequence, use_cache=False).logits[0, prompt_len - 1 : -1].argmax(-1)


def matches(model, keep: list[int], sample: tuple[torch.Tensor, int, torch.Tensor]) -> np.ndarray:
    """Bool (m,): whether the skipping model's teacher-forced top-1 equals the full model's
    (``sample``: sequence (1, L + m), prompt length L, the full model's predictions (m,))."""
    sequence, prompt_len, full = sample
    return (predictions(model, keep, sequence, prompt_len) == full).numpy()


def tokens_per_step(hit: np.ndarray, chain: int) -> float:
    """Greedy self-speculation with ``chain`` drafted tokens per step, walked over ``hit`` (m,)."""
    position, steps, m = 0, 0, hit.shape[0]
    while position < m:
        run = 0
        while run < chain and position + run < m and hit[position + run]:
            run += 1
        position += run + 1
        steps += 1
    return m / steps


def greedy_removal(model, search: list[tuple], max_skip: int, log) -> list[dict]:
    """Layers removed one at a time, each the one whose absence keeps agreement highest."""
    keep = list(range(len(model.model.layers)))
    path = []
    for _ in range(max_skip):
        best = None
        for layer in keep:
            trial = [i for i in keep if i != layer]
            hit = np.concatenate([matches(model, trial, sample) for sample in search])
            if best is None or hit.mean() > best[1]:
                best = (layer, float(hit.mean()))
        keep.remove(best[0])
        path.append({"skipped": len(path) + 1, "removed": best[0], "search_agreement": round(best[1], 4), "keep": list(keep)})
        log(f"skip {len(path)}: removed layer {best[0]}, agreement {best[1]:.3f}")
    return path


def draft_step_seconds(model, keep: list[int], ids: torch.Tensor, steps: int = 24) -> float:
    """Median seconds of one single-token forward of the skipping model after ``ids``, with a KV cache."""
    times = []
    with SkippedLayers(model, keep), torch.no_grad():
        kept = list(model.model.layers)
        original = [layer.self_attn.layer_idx for layer in kept]
        for position, layer in enumerate(kept):  # the cache holds one entry per kept layer
            layer.self_attn.layer_idx = position
        try:
            cache = DynamicCache()
            cached = attention_layout(model).cache_kwargs(cache)
            out = model(ids, **cached, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(steps):
                started = time.perf_counter()
                out = model(token, **cached, use_cache=True)
                times.append(time.perf_counter() - started)
                token = out.logits[:, -1:].argmax(-1)
        finally:
            for layer, index in zip(kept, original):
                layer.self_attn.layer_idx = index
    return float(np.median(times))


def evaluate(model, path, evaluation, cost, step_s: dict, layers: int) -> list[dict]:
    """Per skipped count: agreement, tokens per step and projected speed-ups for each chain length."""
    rows = []
    for entry in [{"skipped": 0, "keep": list(range(layers))}, *path]:
        hits = [matches(model, entry["keep"], sample) for sample in evaluation]
        t1 = step_s[0]
        draft = step_s[entry["skipped"]]
        row = {"skipped": entry["skipped"], "fraction": round(entry["skipped"] / layers, 3),
               "agreement": round(float(np.concatenate(hits).mean()), 4),
               "draft_step_ms": round(draft * 1000, 2), "chains": {}}
        for chain in CHAINS:
            per_step = float(np.mean([tokens_per_step(h, chain) for h in hits]))
            cpu = per_step * t1 / (chain * draft + float(cost.seconds[chain + 1]) * t1 / float(cost.seconds[1]))
            share = 1 - entry["skipped"] / layers * LAYER_SHARE
            gpu = per_step / (chain * share + 1.0)
            row["chains"][chain] = {"tokens_per_step": round(per_step, 3), "cpu_speedup": round(cpu, 3),
                                    "gpu_on_paper": round(gpu, 3)}
        rows.append(row)
    return rows


# Share of a SmolLM2-135M step spent in decoder layers (the rest: embeddings, final norm, the
# 49,152 x 576 lm_head): 30 layers of ~3.5M weights against ~28M in the lm_head, by weight bytes.
LAYER_SHARE = 0.79


def markdown(result: dict) -> str:
    lines = [
        "| layers skipped | fraction | top-1 agreement | draft step ms | " + " | ".join(
            f"k={c}: tok/step, CPU x, GPU x (paper)" for c in CHAINS) + " |",
        "|---:|---:|---:|---:|" + "---|" * len(CHAINS),
    ]
    for row in result["evaluation"]:
        cells = [f"{c['tokens_per_step']:.2f}, {c['cpu_speedup']:.2f}x, {c['gpu_on_paper']:.2f}x" for c in row["chains"].values()]
        lines.append(f"| {row['skipped']} | {row['fraction']:.2f} | {row['agreement']:.3f} | {row['draft_step_ms']:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--search-prompts", type=int, default=1, help="prompts per search workload")
    p.add_argument("--eval-prompts", type=int, default=1, help="prompts per evaluation workload (after the search ones)")
    p.add_argument("--tokens", type=int, default=96, help="greedy reference tokens per prompt")
    p.add_argument("--max-skip", type=float, default=0.6, help="largest fraction of layers removed")
    p.add_argument("--context", type=int, default=256,
                   help="prompt tokens kept before each reference output when measuring agreement (bounds the search's cost)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--markdown")
    return p.parse_args(argv)


def main(argv=None) -> int:
    import sys

    from retrieval_draft.sessions.session import Session
    from retrieval_draft.model.models import load_model_and_tokenizer

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    model, tokenizer = load_model_and_tokenizer()
    session = Session(model, tokenizer)
    layers = len(model.model.layers)
    total = args.search_prompts + args.eval_prompts
    workloads = build_workloads(sorted(set(SEARCH_WORKLOADS) | set(EVAL_WORKLOADS)), total, seed=0)

    def sequences(names, start, count):
        made = []
        for name in names:
            for prompt in workloads[name][start : start + count]:
                ids = encode(session, prompt)
                sequence, cut = reference(model, ids, args.tokens), max(0, ids.shape[1] - args.context)
                sequence, prompt_len = sequence[:, cut:], ids.shape[1] - cut  # the prompt's last --context tokens
                made.append((sequence, prompt_len, predictions(model, list(range(layers)), sequence, prompt_len)))
        return made

    started = time.perf_counter()
    search = sequences(SEARCH_WORKLOADS, 0, args.search_prompts)
    evaluation = sequences(EVAL_WORKLOADS, args.search_prompts, args.eval_prompts)
    log(f"references: {time.perf_counter() - started:.0f} s")
    path = greedy_removal(model, search, int(args.max_skip * layers), log)
    probe = evaluation[0][0][:, : evaluation[0][1]]  # an evaluation prompt (cropped)
    step_s = {0: draft_step_seconds(model, list(range(layers)), probe)}
    for entry in path:
        step_s[entry["skipped"]] = draft_step_seconds(model, entry["keep"], probe)
    cost = PluginMemory(persist=True).cost(model)
    result = {
        "model_layers": layers, "tokens": args.tokens, "context": args.context, "search_workloads": SEARCH_WORKLOADS,
        "eval_workloads": EVAL_WORKLOADS, "search_prompts": len(search), "eval_prompts": len(evaluation),
        "removal_path": path, "evaluation": evaluate(model, path, evaluation, cost, step_s, layers),
        "layer_share": LAYER_SHARE, "seconds": round(time.perf_counter() - started, 1),
    }
    report = markdown(result)
    print(report)
    if args.markdown:
        atomic_write_bytes(Path(args.markdown), report.encode("utf-8"))
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps(result, indent=1) + "\n").encode("utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
