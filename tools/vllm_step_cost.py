"""What a speculative step costs in vLLM on this machine: step time against the draft tokens sent.

    .venv-vllm/bin/python -m tools.vllm_step_cost [--model smollm2] [--lengths 0,1,2,4,8] [--max-tokens 192]

Starts one engine whose ``custom_class`` proposer (``JunkProposer``, below) sends, step after step,
drafts of each length of ``--lengths`` in turn (tokens the model will not produce, so every step
gains one token and the context grows alike for every length), and records through
``StepClock`` (the proposer's own clock) the engine's time between two ``propose`` calls against
the draft tokens sent at the first. Per prompt (a short code prompt and a long retrieval prompt)
it prints the median step time per length and the fit ``RequestChains`` uses: a speculative
step's overhead over a plain one and the cost of each draft token, both in plain steps.
Timings need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from retrieval_draft.integrations.step_cost import StepClock, fit_step_cost

ENV_LOG = "RETRIEVAL_DRAFT_STEP_COST_LOG"
ENV_LENGTHS = "RETRIEVAL_DRAFT_STEP_COST_LENGTHS"
MODELS = Path(__file__).resolve().parents[1] / ".cache" / "vllm-models"


class JunkProposer:
    """A ``custom_class`` proposer sending drafts of the lengths in ``ENV_LENGTHS`` in turn, each
    step's engine time appended to ``ENV_LOG`` as JSON lines (``StepClock`` samples)."""

    def __init__(self, vllm_config, *args, **kwargs) -> None:
        self.lengths = [int(x) for x in os.environ[ENV_LENGTHS].split(",")]
        self.clock = StepClock()
        self.log = open(os.environ[ENV_LOG], "a", encoding="utf-8")
        self.turn = 0

    def load_model(self, *args, **kwargs) -> None:
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        rows = len(sampled_token_ids)
        context = int(num_tokens_no_spec[0]) if rows else 0
        self.clock.start()
        sample = self.clock.sample(rows, [len(t) for t in sampled_token_ids])
        if sample is not None:
            self.log.write(json.dumps({"seconds": sample[0], "draft_tokens": sample[1], "context": context}) + "\n")
            self.log.flush()
        n = self.lengths[self.turn % len(self.lengths)]
        self.turn += 1
        drafts = [[1] * n if len(t) else [] for t in sampled_token_ids]  # token 1: never what the model writes here
        self.clock.sent(rows, sum(len(d) for d in drafts))
        return drafts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    p.add_argument("--lengths", default="0,1,2,4,8")
    p.add_argument("--max-tokens", type=int, default=192)
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers import AutoTokenizer

    from tools.bench.workloads import build_workloads
    from tools.vllm_engine import engine, greedy, prompt_ids, smollm2_folder, tiny_model_folder

    folder = (smollm2_folder if args.model == "smollm2" else tiny_model_folder)(MODELS / args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = {name: prompt_ids(tokenizer, group[0].text, group[0].chat, group[0].turns)
               for name, group in build_workloads(["code_raw", "rag"], 1, 0).items()}
    lengths = [int(x) for x in args.lengths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "steps.jsonl"
        os.environ[ENV_LOG], os.environ[ENV_LENGTHS] = str(log), args.lengths
        spec = {"method": "custom_class", "model": f"{__name__ if __name__ != '__main__' else 'tools.vllm_step_cost'}.JunkProposer",
                "num_speculative_tokens": max(lengths)}
        with engine(folder, spec, max_model_len=4096, max_num_seqs=1) as llm:
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], greedy(8), use_tqdm=False)
            for name, ids in prompts.items():
                log.write_text("")
                llm.generate([{"prompt_token_ids": ids}], greedy(args.max_tokens), use_tqdm=False)
                samples = [json.loads(line) for line in log.read_text().splitlines()]
                seconds = np.array([s["seconds"] for s in samples])
                drafted = np.array([s["draft_tokens"] for s in samples])
                medians = {n: float(np.median(seconds[drafted == n])) for n in lengths if (drafted == n).any()}
                plain, overhead, per_token = fit_step_cost(drafted, seconds)
                print(f"{name} ({len(ids)} prompt tokens): median step ms by draft tokens "
                      + ", ".join(f"{n}: {1000 * t:.1f}" for n, t in medians.items())
                      + f"; fit: plain {1000 * plain:.1f} ms, overhead {overhead / plain:.3f}, per token {per_token / plain:.4f} plain steps",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
