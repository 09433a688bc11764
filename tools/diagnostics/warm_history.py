"""Fill an output history by serving held-out requests, and save it.

A server that has answered many code requests has seen how its model writes
code; ``HistoryDrafter`` turns those earlier outputs into drafts. This script
plays that server: it decodes HumanEval problems the benchmark never measures
(from index 52 of the benchmark's shuffle on; ``tools.diagnostics.fit_priors`` uses
40-51, the benchmark the first few), raw and as chat requests, through our
plugin with one shared ``HistoryDrafter``, then saves the history file that
``python -m tools.bench --history`` loads.

    python -m tools.diagnostics.warm_history --out out/history-humaneval.npz [--problems 60]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

FIRST_PROBLEM = 52


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="history file to write (.npz)")
    parser.add_argument("--problems", type=int, default=60, help="HumanEval problems to serve (each raw and as chat)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)

    from retrieval_draft.drafters.history import HistoryDrafter
    from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
    from retrieval_draft.plugin.hf import generate as plugin_generate
    from retrieval_draft.sessions.session import GenerationRequest, load_session
    from tools.bench.workloads import humaneval_subset

    session = load_session()
    problems = humaneval_subset(164, seed=0)[FIRST_PROBLEM : FIRST_PROBLEM + args.problems]
    if not problems:
        parser.error(f"no HumanEval problems from index {FIRST_PROBLEM}")
    history = HistoryDrafter()
    started = time.perf_counter()
    for n, problem in enumerate(problems, 1):
        code = problem["prompt"]
        for text, chat in ((code, False), (f"Complete this function:\n```python\n{code}```", True)):
            ids = session.encode(GenerationRequest(prompt=text, chat=chat))
            session.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                custom_generate=plugin_generate,
                drafters=[PromptLookupDrafter(), history],
            )
        print(f"[{n}/{len(problems)}] {problem['task_id']}: history {history.size} tokens, "
              f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    history.save(args.out, tokenizer=session.tokenizer)
    print(f"wrote {args.out}: {history.size} tokens from {2 * len(problems)} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
