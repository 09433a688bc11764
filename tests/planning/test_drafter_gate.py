"""Drafters whose drafts do not pay for their time are asked less often; useful ones every step."""

from __future__ import annotations

import time

import numpy as np
import torch

import retrieval_draft
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.draft import Draft, Proposals
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.planning.planner import DrafterGate
from tests.conftest import RandomDrafter, make_tiny_llama, random_prompt

NEW_TOKENS = 80


class CountingDrafter(RandomDrafter):
    """Random drafts that take ``delay`` seconds each; counts its queries."""

    def __init__(self, seed: int, name: str, delay: float) -> None:
        super().__init__(seed, branches=1)
        self.name, self.delay, self.queries = name, delay, 0

    def propose(self, context, max_len):
        self.queries += 1
        time.sleep(self.delay)
        return super().propose(context, max_len)


class CountingOracle(OracleDrafter):
    name = "counting_oracle"

    def __init__(self, reference) -> None:
        super().__init__(reference)
        self.queries = 0

    def propose(self, context, max_len):
        self.queries += 1
        return super().propose(context, max_len)


def _plugin(model, prompt, drafters):
    stats = DecodeStats()
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                         do_sample=False, custom_generate=retrieval_draft.generate, drafters=drafters,
                         draft_stats=stats, draft_learning=False)
    return out, stats


def test_a_slow_useless_drafter_is_asked_less_often_and_outputs_stay_identical():
    model = make_tiny_llama(seed=41)
    prompt = random_prompt(41)
    slow = CountingDrafter(1, "slow_junk", delay=0.004)
    out, stats = _plugin(model, prompt, [slow])
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                              do_sample=False)
    assert torch.equal(out, expected)
    assert stats.steps >= 40
    assert slow.queries < stats.steps / 3


def test_a_drafter_that_is_right_is_asked_every_step():
    model = make_tiny_llama(seed=42)
    prompt = random_prompt(42)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                              do_sample=False)
    oracle = CountingOracle(expected[0].numpy())
    out, stats = _plugin(model, prompt, [oracle])
    assert torch.equal(out, expected)
    assert oracle.queries == stats.steps


def asked(step: dict) -> Proposals:
    """One row's proposals for a step: drafter name -> (its drafts, seconds its ``propose`` took)."""
    proposals = Proposals(list(step))
    for name, (drafts, seconds) in step.items():
        proposals.writer(name).extend(drafts)
        proposals.took(seconds)
    return proposals


def test_a_skipped_drafter_comes_back_once_it_pays():
    gate = DrafterGate(min_queries=2, max_interval=8)
    truth = np.array([5, 6, 7, 8])
    wrong = [Draft(np.array([9]), np.array([0.5]))]
    asked_steps = []
    for step in range(40):
        if gate.should_ask("d"):
            asked_steps.append(step)
            drafts = wrong if step < 20 else [Draft(truth, np.full(4, 0.9))]
            step = asked({"d": (drafts, 0.001)})
            gate.observe(step, step.matched(truth), token_seconds=0.01)
    early = [s for s in asked_steps if s < 20]
    late = [s for s in asked_steps if s >= 28]
    assert len(early) < 12  # backed off while its drafts were wrong
    assert late == list(range(28, 40))  # back to every step once right


def test_marginal_tokens_count_only_what_other_drafters_did_not_offer():
    gate = DrafterGate(min_queries=1)
    truth = np.array([1, 2, 3])
    both = [Draft(truth, np.full(3, 0.9))]
    for _ in range(20):
        step = asked({"cheap": (both, 0.00005), "costly": (both, 0.005)})
        gate.observe(step, step.matched(truth), token_seconds=0.01)
    assert gate.records["costly"].marginal == 0.0
    assert not gate.should_ask("costly")  # redundant and slow: skipped
    assert gate.should_ask("cheap")  # redundant too, but under 1% of a step: always asked


def test_a_new_call_asks_a_skipped_drafter_at_once_and_keeps_what_was_learned():
    gate = DrafterGate(min_queries=1)
    truth = np.array([1, 2, 3])
    for _ in range(20):
        step = asked({"cheap": ([Draft(truth, np.full(3, 0.9))], 0.00005), "costly": ([], 0.005)})
        gate.observe(step, step.matched(truth), token_seconds=0.01)
    assert not gate.should_ask("costly")  # offered nothing, slow: waiting
    learned = gate.records["costly"].seconds
    gate.restart()
    assert gate.should_ask("costly")  # the next call's first step asks it
    assert gate.records["costly"].seconds == learned
    step = asked({"cheap": ([Draft(truth, np.full(3, 0.9))], 0.00005), "costly": ([], 0.005)})
    gate.observe(step, step.matched(truth), token_seconds=0.01)
    assert not gate.should_ask("costly")  # still not paying: skipped from that query on, backing off anew
    assert gate.records["costly"].interval == 2


def test_a_one_off_cost_in_early_queries_does_not_gate_a_drafter_that_pays():
    gate = DrafterGate(min_queries=2)
    truth = np.array([1, 2, 3])
    right = [Draft(truth[:1], np.array([0.9]))]  # one token nobody else offers: worth about 0.1 of a step
    for seconds in (0.5, 0.2, 0.0001, 0.0001, 0.0001):  # a kernel loading at the first two queries
        step = asked({"d": (right, seconds)})
        gate.observe(step, step.matched(truth), token_seconds=0.01)
    assert gate.records["d"].seconds == 0.0001  # the steady cost, not the loading
    assert gate.should_ask("d")
