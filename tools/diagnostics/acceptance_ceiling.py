"""Where open text loses tokens per step: what drafts could reach on the model's own outputs.

    python -m tools.diagnostics.acceptance_ceiling [--workloads text,chat] [--prompts 4] [--max-new-tokens 128] [--json PATH]

For each benchmark prompt it generates greedily through the README call
(identical to HF greedy; one model handle per workload as in ``tools.bench``;
the plugin's ``DecodeStats`` give the tokens per step it reached), then runs
one forward over prompt + output for the model's top-k next tokens at every
position. It then replays decoding step by step with the plugin's own drafter
classes, uncalibrated, and counts tokens per step (accepted drafts plus the
bonus token) as if every drafted node were verified, with no cost-based pruning:

- ``lookup``: ``PromptLookupDrafter`` with one branch: the continuation (up to 16
  tokens) after the latest earlier occurrence of the longest suffix (4 tokens
  down to 1) of the text so far, prompt included;
- ``recycle N``: ``RecyclingDrafter``'s best-first tree of N nodes from the last
  token through its table of the model's top-k successors (k=4 unless named),
  each recorded when its position was verified: Token Recycling's table;
- ``lookup + recycle N``: both, a step accepting the longer match.

It also counts the steps whose first token no drafter had ("first miss").
Each column is the ceiling of those drafters alone at that tree size: nothing
is priced, so a cost-sized tree of the same drafters reaches less. The plugin
also drafts from its output history and records every verified node (the
replayed table records only the output path), so its measured figure can pass
a column; where it does, what is missing is not tree size or pruning but
draft sources. Within a workload the table carries from prompt to prompt, as
the plugin's memory does on one model handle. "mean of workloads" is the
unweighted mean of the workloads' tokens per step.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np

from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.drafters.recycling import RecyclingDrafter

LOOKUP_MATCH = 4  # longest suffix matched, tokens
DRAFT_LEN = 16  # longest draft path, tokens
# (column, use lookup, recycled tree nodes, successors kept per token)
DRAFT_SETS = (
    ("lookup", True, 0, 4),
    ("recycle 16", False, 16, 4),
    ("lookup + recycle 8", True, 8, 4),
    ("lookup + recycle 16", True, 16, 4),
    ("lookup + recycle 64", True, 64, 4),
    ("lookup + recycle 64, k=8", True, 64, 8),
)


def matched(draft, truth: np.ndarray) -> int:
    """Leading tokens of ``draft`` equal to ``truth``'s."""
    n = 0
    while n < min(len(draft), len(truth)) and draft[n] == truth[n]:
        n += 1
    return n


def replay(tokens: np.ndarray, prompt_len: int, top_ids: np.ndarray, top_probs: np.ndarray,
           use_lookup: bool, recycled: RecyclingDrafter | None) -> tuple[int, int, int]:
    """Replay the greedy decoding of ``tokens[prompt_len:]`` with ideal verification.

    ``top_ids`` / ``top_probs``: shape (T, k'), the model's top-k' next tokens and
    probabilities after each position (k' >= the drafter's k). ``recycled`` (carried
    between prompts by the caller, its ``max_nodes`` the tree size) drafts before each
    step and records the positions the step verified. Returns (steps, tokens emitted,
    first misses).
    """
    lookup = PromptLookupDrafter(max_ngram=LOOKUP_MATCH, max_branches=1) if use_lookup else None
    steps = emitted = first_misses = 0
    position = prompt_len - 1  # the last token the model has seen; the step predicts what follows it
    while position < len(tokens) - 1:
        context, truth = tokens[: position + 1], tokens[position + 1 :]
        drafts = (lookup.propose(context, DRAFT_LEN) if lookup else []) + (
            recycled.propose(context, DRAFT_LEN) if recycled else [])
        best = max([0] + [matched(draft.tokens, truth) for draft in drafts])
        step = min(best + 1, len(truth))
        if recycled is not None:
            verified = slice(position, position + step)
            k = recycled.k
            columns = np.concatenate([top_ids[verified, :k].astype(np.int32),
                                      top_probs[verified, :k].astype(np.float32).view(np.int32)], axis=1)
            recycled.tree_receive(tokens[verified], columns)
        steps, emitted, first_misses = steps + 1, emitted + step, first_misses + (best == 0)
        position += step
    return steps, emitted, first_misses


def collect(workloads: list[str], prompts: int, max_new_tokens: int, model_path: str | None) -> list[dict]:
    """Per prompt: its workload, prompt length, prompt + greedy output ids, the plugin's (tokens
    emitted by its steps, steps), and the model's top-8 next tokens (ids, probabilities) at every
    position. The plugin runs on one model handle per workload, as in ``tools.bench``."""
    import torch

    import retrieval_draft
    from retrieval_draft.decode.engine import DecodeStats
    from retrieval_draft.sessions.session import load_session
    from tools.bench.run import encode
    from tools.bench.workloads import build_workloads

    session = load_session(model_path)
    records = []
    for workload, group in build_workloads(workloads, prompts, 0, session.tokenizer).items():
        model = copy.copy(session.model)  # the plugin's memory per workload, as tools.bench keeps it (ModelHandles)
        for prompt in group:
            ids = encode(session, prompt)
            stats = DecodeStats()
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                                         custom_generate=retrieval_draft.generate, draft_stats=stats)
            with torch.no_grad():
                probs = torch.softmax(session.model(out).logits[0].float(), dim=-1)
            top = torch.topk(probs, 8, dim=-1)
            records.append({"workload": workload, "prompt_len": int(ids.shape[1]), "tokens": out[0].numpy(),
                            "plugin": (stats.step_tokens, stats.steps), "top_ids": top.indices.numpy(), "top_probs": top.values.numpy()})
            print(f"{workload}: {prompt.prompt_id}, {out.shape[1] - ids.shape[1]} new tokens", flush=True)
    return records


def ceilings(records: list[dict]) -> dict[str, dict[str, float]]:
    """Workload -> column -> tokens per step (and ``first miss`` share for the widest set)."""
    table: dict[str, dict[str, float]] = {}
    workloads = list(dict.fromkeys(r["workload"] for r in records))
    for workload in workloads:
        group = [r for r in records if r["workload"] == workload]
        row = {"plugin (measured)": sum(r["plugin"][0] for r in group) / sum(r["plugin"][1] for r in group)}
        vocab = max(int(max(r["tokens"].max(), r["top_ids"].max())) for r in group) + 1
        for column, use_lookup, nodes, k in DRAFT_SETS:
            recycled = RecyclingDrafter(vocab, k=k, max_nodes=nodes) if nodes else None
            steps = emitted = misses = 0
            for r in group:
                s, e, m = replay(r["tokens"], r["prompt_len"], r["top_ids"], r["top_probs"], use_lookup, recycled)
                steps, emitted, misses = steps + s, emitted + e, misses + m
            row[column] = emitted / steps
            row["first miss, " + column] = misses / steps
        table[workload] = row
    table["mean of workloads"] = {key: float(np.mean([table[w][key] for w in workloads])) for key in table[workloads[0]]}
    return table


def markdown(table: dict[str, dict[str, float]]) -> str:
    columns = ["plugin (measured)"] + [name for name, *_ in DRAFT_SETS]
    lines = ["| workload | " + " | ".join(columns) + " | first miss (widest) |",
             "|---|" + "---:|" * (len(columns) + 1)]
    widest = "first miss, " + DRAFT_SETS[-1][0]
    for workload, row in table.items():
        cells = [f"{row[c]:.2f}" for c in columns] + [f"{row[widest]:.0%}"]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tools.bench.workloads import TEXT_WORKLOADS, WORKLOADS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workloads", default="text,chat", help=f"comma list of {','.join(WORKLOADS)} (text: the six text ones)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per workload")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--model", default=None, help="local model directory or .gguf (default SmolLM2-135M)")
    p.add_argument("--json", help="write the table as JSON here")
    args = p.parse_args(argv)
    workloads = [w for part in args.workloads.split(",") for w in (TEXT_WORKLOADS if part == "text" else (part,))]
    if any(w not in WORKLOADS for w in workloads):
        p.error(f"--workloads takes a comma list of {', '.join(WORKLOADS)} or text")
    if args.prompts < 1 or args.max_new_tokens < 1:
        p.error("--prompts and --max-new-tokens must be at least 1")
    table = ceilings(collect(workloads, args.prompts, args.max_new_tokens, args.model))
    print(markdown(table))
    if args.json:
        command = " ".join(["python", "-m", "tools.diagnostics.acceptance_ceiling", *(sys.argv[1:] if argv is None else argv)])
        payload = {"command": command, "tokens_per_step": table}
        atomic_write_bytes(Path(args.json), (json.dumps(payload, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
