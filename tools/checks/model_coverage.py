"""Model coverage: the plugin against plain greedy ``generate`` on a tiny model of every causal-LM architecture.

    python -m tools.checks.model_coverage [--out FILE.md] [--only TYPE,TYPE] [--prompts N]

Enumerates transformers' causal-LM auto mapping (``tools/checks/model_zoo.py``), runs
``tests/zoo_check.check`` on each entry, and prints a markdown table:
architecture, class, window kind, result, accepted tokens per step, and the
largest gap between the plugin's and plain generate's logits (relative,
``zoo_check.logit_gap``). With ``--out`` the table goes to FILE.md and the
outcomes to FILE.json beside it.
``--prompts N`` runs N prompt blocks on every model (not only until drafts are
accepted, as the test does): a deeper sweep for outputs that differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import Counter
from pathlib import Path

import torch
import transformers

from tools.checks.model_zoo import causal_lm_architectures
from tools.checks.zoo_check import IDENTICAL, Outcome, check, one_numba_thread


def result_text(outcome: Outcome) -> str:
    """The table's result cell: 'identical as a tree', 'refused: reason', 'set aside: reason', ..."""
    if outcome.result == IDENTICAL:
        return f"identical as a {outcome.mode}"
    return f"{outcome.result}: {outcome.detail}" if outcome.detail else outcome.result


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(outcomes: list[Outcome]) -> str:
    """The coverage table, one row per architecture, then the counts per result."""
    lines = [
        "| architecture | class | window | result | accepted tokens/step | logit gap |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        per_step = f"{o.tokens_per_step:.2f}" if o.tokens_per_step else ""
        gap = f"{o.logit_gap:.0e}" if o.logit_gap else ""
        lines.append(
            f"| {o.model_type} | {o.class_name} | {o.window} | {_cell(result_text(o))} | {per_step} | {gap} |"
        )
    lines += ["", "Counts: " + ", ".join(f"{name} {n}" for name, n in summary(outcomes).items())]
    return "\n".join(lines) + "\n"


def summary(outcomes: list[Outcome]) -> dict[str, int]:
    """Architectures per result, identical split by verification mode."""
    return dict(Counter(result_text(o) if o.result == IDENTICAL else o.result for o in outcomes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the table to this .md file and the outcomes as .json beside it")
    parser.add_argument("--only", help="comma-separated model types to check (default: all)")
    parser.add_argument("--prompts", type=int, help="run this many prompt blocks on every model (default: the test's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    wanted = set(args.only.split(",")) if args.only else None
    sweep = {"seeds": range(args.prompts), "every": True} if args.prompts else {}
    outcomes = []
    with one_numba_thread():
        for model_type, class_name in causal_lm_architectures():
            if wanted is None or model_type in wanted:
                outcomes.append(check(model_type, class_name, **sweep))
                done = outcomes[-1]
                print(f"{model_type}: {result_text(done)} ({done.seconds}s)", file=sys.stderr, flush=True)
    table = markdown_table(outcomes)
    print(table)
    if args.out:
        args.out.write_text(table)
        args.out.with_suffix(".json").write_text(json.dumps([o.as_dict() for o in outcomes], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
