"""Replay greedy decoding through the proposers offline: what vLLM would accept, and the modelled speed.

    .venv-vllm/bin/python -m tools.vllm_replay [--workloads code_raw,grounded,chat,rag,repo]
        [--prompts 3] [--max-tokens 64] [--k 8] [--datastore DIR] [--overhead 0.03] [--per-token 0.08]

Greedy verification accepts a draft's longest prefix equal to the model's own greedy tokens, then
adds one token. So given each prompt's greedy output (HF transformers on the same float32 folder
vLLM serves, cached under ``.cache/vllm-replay/``), a proposer can be replayed without the engine:
each step it drafts, the matching prefix is accepted, and the request gains it plus the next
token. Per system: vLLM's acceptance length (1 + accepted / drafts), draft tokens sent per step,
and the modelled speed-up over plain decoding, each step costing 1 + overhead (any draft) +
per-token x draft tokens plain steps (``tools.vllm_step_cost`` measures both). Systems: ``ngram``
(vLLM's own kernel, min 2, max 5), ``suffix`` (ArcticInference's cache as vLLM drives it),
``ours`` (``RequestChains`` as the proposer builds it, cost-sized), ``ours_whole`` (every chain
sent whole, the 0.1 cut), and with ``--datastore`` ``ours_store``. Each system replays the
workloads in order through one proposer (its history and rates carry over, as in one engine).
Quick: a design check on 2 cores, not a timing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "vllm-replay"


def reference_outputs(folder: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy outputs of ``prompts`` (token ids) with HF transformers, cached by content."""
    key = hashlib.sha256(json.dumps([str(folder), prompts, max_tokens]).encode()).hexdigest()[:20]
    path = CACHE / f"{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    outputs = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 do_sample=False)
            outputs.append(out[0, len(ids):].tolist())
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outputs))
    return outputs


def replay(propose, prompt: list[int], truth: list[int], k: int) -> list[tuple[int, int]]:
    """(draft tokens sent, accepted) per verifying step of one request; ``propose(gained, context)``
    returns the draft after the request gained ``gained`` and holds ``context``."""
    context = list(prompt) + truth[:1]
    gained, steps, pos = truth[:1], [], 1
    while pos < len(truth):
        draft = list(propose(gained, context))[: min(k, len(truth) - pos)]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == truth[pos + accepted]:
            accepted += 1
        steps.append((len(draft), accepted))
        gained = truth[pos: pos + accepted + 1]
        context += gained
        pos += accepted + 1
    return steps


def chains_proposer(chains):
    """A ``replay`` propose function over one ``RequestChains`` (one request at a time, row 0)."""

    def propose(gained, context):
        rows = np.array([context], dtype=np.int64)
        return chains.propose([gained], np.array([len(context)]), rows)[0]

    return propose


def ngram_proposer(k: int):
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as find

    return lambda gained, context: find(np.array(context, dtype=np.int32), 2, 5, 10**6, k).tolist()


class SuffixReplay:
    """ArcticInference's suffix cache driven as vLLM 0.32's ``suffix`` method drives it."""

    def __init__(self, k: int) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
        self.k, self.request = k, 0

    def for_request(self, prompt: list[int]):
        if self.request:
            self.cache.stop_request(str(self.request - 1))
        rid = str(self.request)
        self.request += 1
        self.cache.start_request(rid, np.array(prompt, dtype=np.int32))

        def propose(gained, context):
            self.cache.add_active_response(rid, list(gained))
            draft = self.cache.speculate(rid, np.array(context[-24:], dtype=np.int32), max_spec_tokens=self.k,
                                         max_spec_factor=1.0, min_token_prob=0.1)
            return list(draft.token_ids)

        return propose


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="code_raw,grounded,chat,rag")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--datastore", default=None)
    p.add_argument("--systems", default="ngram,suffix,ours,ours_whole,ours_store")
    p.add_argument("--overhead", type=float, default=0.03)
    p.add_argument("--per-token", type=float, default=0.08)
    args = p.parse_args(argv)
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from retrieval_draft.integrations.step_cost import CostShape
    from retrieval_draft.integrations.vllm_proposer import ProposerSettings, RetrievalDraftProposer
    from tools.bench.vllm import MODELS, vllm_workloads
    from tools.vllm_engine import smollm2_folder

    folder = smollm2_folder(MODELS / "smollm2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    workloads, repo_stores = vllm_workloads([w for w in args.workloads.split(",") if w], args.prompts, 0, tokenizer)
    stores = ([args.datastore] if args.datastore else []) + repo_stores
    truths = {name: reference_outputs(folder, prompts, args.max_tokens) for name, prompts in workloads.items()}
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=args.k),
                             model_config=SimpleNamespace(max_model_len=4096, get_vocab_size=lambda: len(tokenizer),
                                                          tokenizer=str(folder)))
    shape = CostShape(args.overhead, args.per_token)
    for system in [s for s in args.systems.split(",") if s]:
        if system == "ours_store" and not stores:
            continue
        if system.startswith("ours"):
            settings = ProposerSettings(datastores=tuple(stores) if system == "ours_store" else (),
                                        step_cost=None if system == "ours_whole" else shape,
                                        min_prob=0.1 if system == "ours_whole" else 0.0)
            proposer = RetrievalDraftProposer(config, settings, tokenizer=tokenizer if system == "ours_store" else None)
            if proposer.chains.cost is not None:
                proposer.chains.cost.observe = lambda seconds, draft_tokens: None  # keep the given shape
            make = lambda prompt, c=proposer.chains: chains_proposer(c)
        elif system == "suffix":
            make = SuffixReplay(args.k).for_request
        else:
            make = lambda prompt: ngram_proposer(args.k)
        cells = []
        for name, prompts in workloads.items():
            steps = [s for prompt, truth in zip(prompts, truths[name]) for s in replay(make(prompt), prompt, truth, args.k)]
            sent = np.array([s for s, _ in steps])
            accepted = np.array([a for _, a in steps])
            drafting = sent > 0
            cost = (1 + args.overhead * drafting + args.per_token * sent).sum() + len(prompts)  # + the prefill's token
            tokens = accepted.sum() + len(steps) + len(prompts)
            length = 1 + accepted[drafting].sum() / max(drafting.sum(), 1)
            cells.append(f"{name} {tokens / cost:.2f}x al {length:.2f} sent/step {sent.mean():.1f}")
        print(f"{system:11s} " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
