"""Measure prompt lookup's acceptance rates by match length, on held-out prompts.

The starting probabilities in ``retrieval_draft/drafters/tail_match.py``
(FIRST_TOKEN_PROB, NEXT_TOKEN_PROB by match-length band) come from this
script. It greedily decodes prompts that the benchmark does not use
(HumanEval problems 40-51 of the benchmark's shuffle, raw and as chat; ten
other standard-library functions; eight other chat requests), then, at every
position of every output, copies after the longest, most recent tail match
and records which copied tokens the model produced:

- first token: accepted / tried, by the match length L;
- later tokens: the i-th copied token, given tokens 0..i-1 were right,
  extends a match of length L + i; accepted / tried by that length.

    python -m tools.diagnostics.fit_priors [--refs refs.json] [--json out.json]

``--refs`` caches the greedy outputs (written when missing, read when present).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.drafters.tail_match import MATCH_LENGTH_BANDS, tail_matches

HELD_OUT_TASKS = range(40, 52)  # HumanEval problems in the benchmark's shuffle; the bench uses the first few
HELD_OUT_GROUNDED = (
    ("posixpath", "normpath", "Reproduce this function exactly."),
    ("fnmatch", "translate", "Add a docstring to every function."),
    ("heapq", "nsmallest", "Add type hints to this code."),
    ("string", "capwords", "Add comments explaining each step."),
    ("calendar", "Calendar.itermonthdays", "Rename the variables to be more descriptive."),
    ("difflib", "SequenceMatcher.get_opcodes", "Reproduce this function exactly."),
    ("textwrap", "TextWrapper._wrap_chunks", "Add type hints to this code."),
    ("shlex", "split", "Add a docstring to every function."),
    ("colorsys", "rgb_to_hls", "Add comments explaining each step."),
    ("operator", "attrgetter.__init__", "Reproduce this function exactly."),
)
HELD_OUT_CHAT = (
    "Explain recursion with a simple example.",
    "Write a limerick about a cat who loves coffee.",
    "What should I pack for a weekend camping trip?",
    "Summarize the causes of the French Revolution.",
    "How do vaccines train the immune system?",
    "Give me a recipe for a quick vegetable soup.",
    "What is the difference between a list and a tuple in Python?",
    "Write a polite email declining a meeting invitation.",
)
MAX_MATCH = 32
MAX_COPY = 32


def held_out_requests() -> list[tuple[str, str, bool]]:
    """(id, text, chat) of every held-out prompt."""
    from tools.bench.workloads import humaneval_subset, stdlib_source

    requests = []
    problems = humaneval_subset(max(HELD_OUT_TASKS) + 1, seed=0)
    for index in HELD_OUT_TASKS:
        code, task = problems[index]["prompt"], problems[index]["task_id"]
        requests.append((f"code_raw/{task}", code, False))
        requests.append((f"code_chat/{task}", f"Complete this function:\n```python\n{code}```", True))
    for module, qualname, request in HELD_OUT_GROUNDED:
        try:
            source = stdlib_source(module, qualname)
        except (OSError, TypeError, AttributeError, ImportError):
            continue
        requests.append((f"grounded/{module}.{qualname}", f"{request}\n\n```python\n{source}```", True))
    requests.extend((f"chat/{i}", text, True) for i, text in enumerate(HELD_OUT_CHAT))
    return requests


def greedy_references(max_new_tokens: int) -> dict:
    """{id: {"prompt": ids, "out": ids}} from HF greedy decoding of the default model."""
    import torch

    from retrieval_draft.sessions.session import GenerationRequest, load_session

    session = load_session()
    refs = {}
    for key, text, chat in held_out_requests():
        ids = session.encode(GenerationRequest(prompt=text, chat=chat))
        with torch.no_grad():
            out = session.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
        refs[key] = {"prompt": ids[0].tolist(), "out": out[0, ids.shape[1]:].tolist()}
        print(f"decoded {key}", file=sys.stderr, flush=True)
    return refs


def acceptance_by_match_length(refs: dict) -> dict:
    """Tried and accepted counts per match-length band, for first and later copied tokens."""
    bands = MATCH_LENGTH_BANDS.shape[0]
    tried = {"first": np.zeros(bands), "next": np.zeros(bands)}
    right = {"first": np.zeros(bands), "next": np.zeros(bands)}
    for ref in refs.values():
        prompt, out = np.asarray(ref["prompt"], np.int64), np.asarray(ref["out"], np.int64)
        for pos in range(out.shape[0] - 1):
            context = np.concatenate([prompt, out[:pos]])
            ends, lengths = tail_matches(context, context, MAX_MATCH)
            if ends.shape[0] == 0:
                continue
            best = np.lexsort((-ends, -lengths))[0]
            length, end = int(lengths[best]), int(ends[best])
            copied = context[end + 1 : end + 1 + MAX_COPY]
            truth = out[pos:]
            for i in range(min(copied.shape[0], truth.shape[0])):
                kind = "first" if i == 0 else "next"
                band = int(np.searchsorted(MATCH_LENGTH_BANDS, length + i, side="right") - 1)
                tried[kind][band] += 1
                if copied[i] != truth[i]:
                    break
                right[kind][band] += 1
    return {
        "bands": MATCH_LENGTH_BANDS.tolist(),
        **{f"{kind}_rate": np.round(right[kind] / np.maximum(tried[kind], 1), 3).tolist() for kind in tried},
        **{f"{kind}_tried": tried[kind].astype(int).tolist() for kind in tried},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refs", type=Path, help="cache of greedy outputs (JSON)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, help="write the measured rates here")
    args = parser.parse_args(argv)
    if args.refs is not None and args.refs.exists():
        refs = json.loads(args.refs.read_text())
    else:
        refs = greedy_references(args.max_new_tokens)
        if args.refs is not None:
            atomic_write_bytes(args.refs, json.dumps(refs).encode())
    table = acceptance_by_match_length(refs)
    print("| match length from | first token: rate (tried) | later token: rate (tried) |")
    print("|---:|---:|---:|")
    for i, edge in enumerate(table["bands"]):
        print(
            f"| {edge} | {table['first_rate'][i]:.2f} ({table['first_tried'][i]}) "
            f"| {table['next_rate'][i]:.2f} ({table['next_tried'][i]}) |"
        )
    if args.json is not None:
        atomic_write_bytes(args.json, (json.dumps(table, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
