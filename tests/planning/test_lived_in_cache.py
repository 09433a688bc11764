"""A lived-in user cache cannot hold decoding back for good: planted wrong curves and rates are
corrected within a stated number of steps or calls, in one process and across processes.

Planted states: curves too dear or too cheap, rates saying no draft or every draft is accepted.
A real cache, after an hour of other work on a 2-core machine, priced a 3-token forward at 11.6
lone roots; every later process planned lone roots and ran slower than plain ``generate``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.draft import Draft
from retrieval_draft.drafters.oracle import OracleDrafter
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.planning.cost import ObservedCost, VerifyCost, plausible
from retrieval_draft.planning.cost_file import cost_key, cost_path, read_cost, write_cost
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.planning.rates_file import STORED_TRIALS, rates_path, read_rates
from tests.conftest import make_tiny_llama, random_prompt

NEW_TOKENS = 48


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


def true_seconds(tokens: int) -> float:
    """A CPU's forward: 16 new tokens cost about two lone roots."""
    return 0.050 * (1.0 + 0.07 * (tokens - 1))


TRUE = VerifyCost.from_points([1, 2, 4, 8, 16, 32], [true_seconds(k) for k in (1, 2, 4, 8, 16, 32)])
# The cache found on the machine: right at 1-2 tokens, 11.6 lone roots from 3 to 16, 53 at 32.
SPOILED = VerifyCost.from_points([1, 2, 3, 16, 32], [0.050, 0.050, 0.580, 0.580, 2.67])
CHAIN = 0.93 ** np.arange(1, 17)  # one row's candidates: a chain of 16 likely drafts, decreasing


def tokens_per_second(width: int) -> float:
    return (1.0 + CHAIN[:width].sum()) / true_seconds(width + 1)


def test_a_curve_too_dear_for_trees_is_corrected_by_the_trees_the_planner_tries():
    fresh = TreePlanner(tree_budget=16, cost=TRUE)
    best = tokens_per_second(fresh.width([CHAIN]))
    planner = TreePlanner(tree_budget=16, cost=SPOILED)
    assert planner.width([CHAIN]) <= 1  # what the spoiled curve alone would plan, step after step
    widths = []
    for _ in range(12):
        width = planner.width([CHAIN])
        widths.append(width)
        planner.observe_forward(1, width + 1, true_seconds(width + 1))
    assert max(widths[:4]) >= 8  # a dear-looking tree was tried within the first steps
    assert all(tokens_per_second(w) >= 0.9 * best for w in widths[4:]), widths  # and then planned as fresh


def test_on_a_right_curve_each_untried_size_band_is_tried_once_then_the_best_is_kept():
    planner = TreePlanner(tree_budget=16, cost=TRUE)
    best = planner.width([CHAIN])
    widths = []
    for _ in range(30):
        width = planner.width([CHAIN])
        widths.append(width)
        planner.observe_forward(1, width + 1, true_seconds(width + 1))
    assert sum(w != best for w in widths) <= len(ObservedCost.BANDS)
    assert widths[-10:] == [best] * 10


def test_a_band_seen_dear_in_a_busy_spell_is_tried_again_once_its_observation_expires():
    observed = ObservedCost(expire_forwards=20)
    observed.observe(TRUE, 16, 10 * true_seconds(16))  # a spell: ten times the curve
    assert observed.verified()[observed.size_bands(np.array([16]))[0]]
    for _ in range(21):
        observed.observe(TRUE, 1, true_seconds(1))
    band = observed.size_bands(np.array([16]))[0]
    assert not observed.verified()[band]  # expired: the planner may try it again
    observed.observe(TRUE, 16, true_seconds(16))
    assert observed.ratio[0, 0, band] == pytest.approx(1.0)  # replaced, not averaged with the spell


def plugin(model, prompt, memory, drafters, stats=None):
    return model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False,
        custom_generate=retrieval_draft.generate, drafters=drafters, draft_memory=memory, draft_stats=stats,
    )


@pytest.fixture(scope="module")
def oracle_case():
    """A tiny model, a prompt, HF's greedy output and an oracle drafter that proposes it."""
    model = make_tiny_llama(seed=41)
    prompt = random_prompt(41)
    reference = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False)
    return model, prompt, reference


def nodes_per_step(model, prompt, reference, memory) -> float:
    stats = DecodeStats()
    out = plugin(model, prompt, memory, [OracleDrafter(reference[0].numpy())], stats)
    assert torch.equal(out, reference)
    return stats.tree_nodes / stats.steps


def test_an_implausible_stored_curve_is_measured_again_and_the_first_call_verifies_trees(oracle_case):
    model, prompt, reference = oracle_case
    key = cost_key(model)
    write_cost(cost_path(key), key, SPOILED)
    memory = PluginMemory()  # a new process on the lived-in cache
    assert nodes_per_step(model, prompt, reference, memory) > 2.0
    assert memory.model(model).cost is None or plausible(memory.model(model).cost)


def test_a_plausible_but_too_dear_stored_curve_is_corrected_within_two_calls_and_kept_for_later_processes(oracle_case):
    """Within the plausible limit (1.45 lone roots per token from 3 tokens on) yet far dearer than
    a tiny model's nearly flat forwards: trees are tried, timed and kept."""
    model, prompt, reference = oracle_case
    key = cost_key(model)
    lone = 0.004
    dear = VerifyCost(np.array([lone, lone, lone] + [1.45 * k * lone for k in range(3, 65)]))
    assert plausible(dear)
    write_cost(cost_path(key), key, dear)
    memory = PluginMemory()
    per_call = [nodes_per_step(model, prompt, reference, memory) for _ in range(4)]  # 2-3 forwards each
    assert min(per_call[1:]) > 4.0, per_call
    memory.save_learned(model, force=True)
    later = PluginMemory()  # the next process reads what this one kept (a corrected or re-measured curve)
    assert nodes_per_step(model, prompt, reference, later) > 4.0
    kept = read_cost(cost_path(key), key)
    assert kept is not None and kept.seconds[8] < dear.seconds[8]


def test_planted_rates_that_no_draft_is_ever_accepted_lose_their_weight_within_a_call(oracle_case):
    model, prompt, reference = oracle_case
    memory = PluginMemory()
    nodes_per_step(model, prompt, reference, memory)  # learns the oracle's rates; saved on the first call
    path = rates_path(model)
    body = json.loads(path.read_text())
    for calibrator in body["greedy"].values():
        calibrator["hits"] = np.zeros_like(np.asarray(calibrator["hits"])).tolist()
        calibrator["trials"] = np.full_like(np.asarray(calibrator["trials"]), 1e6).tolist()
    path.write_text(json.dumps(body))
    read = read_rates(path)[False]["oracle"]
    assert read.trials.max() == pytest.approx(STORED_TRIALS) and read.hits.max() == 0.0  # a head start, not a verdict
    later = PluginMemory()
    per_call = [nodes_per_step(model, prompt, reference, later) for _ in range(3)]
    assert per_call[-1] > 4.0, per_call


def dear_seconds(tokens: int) -> float:
    """A CPU's forward where every new token costs a lone root (a larger model's matmuls)."""
    return 0.050 * tokens


# A cache that prices every tree like a lone root (a GPU's curve, or one measured on a faster day).
CHEAP = VerifyCost.from_points([1, 2, 4, 8, 16, 32], [0.050] * 6)


def test_a_curve_too_cheap_for_trees_is_corrected_by_the_forwards_it_plans():
    def speed(width: int) -> float:
        return (1.0 + CHAIN[:width].sum()) / dear_seconds(width + 1)

    best = speed(TreePlanner(tree_budget=16, cost=VerifyCost.from_points(
        [1, 2, 4, 8, 16, 32], [dear_seconds(k) for k in (1, 2, 4, 8, 16, 32)])).width([CHAIN]))
    planner = TreePlanner(tree_budget=16, cost=CHEAP)
    assert planner.width([CHAIN]) == 16  # what the cheap curve alone would plan: 17 lone roots a step
    widths = []
    for _ in range(12):
        width = planner.width([CHAIN])
        widths.append(width)
        planner.observe_forward(1, width + 1, dear_seconds(width + 1))
    assert all(speed(w) >= 0.9 * best for w in widths[len(ObservedCost.BANDS):]), widths


class WrongDrafter(OracleDrafter):
    """Proposes, with full confidence, a token the model never picks next (the reference's next
    token plus one, modulo ``vocab_size``)."""

    def __init__(self, reference: np.ndarray, vocab_size: int) -> None:
        super().__init__(reference)
        self.vocab_size = vocab_size

    def propose(self, context: np.ndarray, max_len: int):
        return [Draft((d.tokens + 1) % self.vocab_size, d.probs) for d in super().propose(context, max_len)]


def test_planted_rates_that_every_draft_is_accepted_lose_their_weight_call_by_call(oracle_case):
    """Drafts graded wrong at every step pull the planted rate down whatever size the trees take (the
    rate, not the tree sizes, is asserted: those also follow the machine's timings). Slower than the
    other way round: a draft wrong at its first token never grades its deeper tokens, so their
    planted cells keep the pooled estimate up, and the drafter gate asks (so grades) a drafter that
    adds nothing on fewer steps: the gate is kept across calls, so from its second call on such a
    drafter is asked at steps 1, 2, 4, 8, ... only (1.0, then about 0.6, 0.5, 0.43; a fresh cache 0.05)."""
    model, prompt, reference = oracle_case
    wrong = WrongDrafter(reference[0].numpy(), model.config.vocab_size)

    def sure_draft_rate(memory) -> float:  # calibrated acceptance of a first draft token given at full confidence
        return float(memory.model(model).rates[False]["oracle"].rates(np.array([1.0]))[0])

    def call(memory) -> float:
        out = plugin(model, prompt, memory, [wrong])
        assert torch.equal(out, reference)  # wrong drafts never change the output
        return sure_draft_rate(memory)

    fresh = PluginMemory()
    untaught = [call(fresh) for _ in range(3)]  # what a fresh cache learns of these drafts (and saves)
    path = rates_path(model)
    body = json.loads(path.read_text())
    for calibrator in body["greedy"].values():
        calibrator["trials"] = np.full_like(np.asarray(calibrator["trials"]), 1e6).tolist()
        calibrator["hits"] = calibrator["trials"]
    path.write_text(json.dumps(body))
    read = read_rates(path)[False]["oracle"]
    assert read.trials.max() == pytest.approx(STORED_TRIALS) and read.hits.min() == pytest.approx(STORED_TRIALS)
    later = PluginMemory()
    planted = [sure_draft_rate(later)] + [call(later) for _ in range(3)]
    assert planted[0] > 0.99 and untaught[-1] < 0.05
    assert all(b < 0.9 * a for a, b in zip(planted, planted[1:])), planted  # each call takes a tenth off, at least
    assert planted[-1] < 0.5, planted
