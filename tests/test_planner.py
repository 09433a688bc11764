"""Cost-aware tree sizing, acceptance calibration and learning from outputs."""

import numpy as np
import torch

import retrieval_draft
from retrieval_draft.calibration import AcceptanceCalibrator
from retrieval_draft.cost import VerifyCost, measure_cost
from retrieval_draft.drafters.base import Draft, Drafter
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.planner import TreePlanner
from tests.conftest import random_prompt

# CPU-like curve from shared/DESIGN.md: ms per forward over k new tokens.
CPU_CURVE = VerifyCost.from_points([1, 2, 4, 8, 16, 32, 64], [34, 37, 52, 61, 67, 83, 120])
FLAT_CURVE = VerifyCost.from_points([1, 64], [10, 11])


def chain(tokens, probs):
    return Draft(np.array(tokens), np.array(probs, dtype=float))


def test_unlikely_drafts_are_not_worth_verifying_on_a_cpu():
    assert CPU_CURVE.best_size(np.array([0.05, 0.04, 0.03])) == 0


def test_likely_drafts_grow_the_tree():
    assert CPU_CURVE.best_size(np.full(8, 0.9)) == 8


def test_a_flat_gpu_like_curve_takes_more_nodes_than_a_steep_one():
    probs = np.sort(np.random.default_rng(0).uniform(0.0, 0.5, 40))[::-1]
    assert FLAT_CURVE.best_size(probs) > CPU_CURVE.best_size(probs)


def test_calibrator_moves_toward_the_observed_rate():
    calibrator = AcceptanceCalibrator(decay=1.0)
    raw = np.full(200, 0.85)
    calibrator.update(raw, np.zeros(200, dtype=bool))
    assert calibrator.rates(np.array([0.85]))[0] < 0.05
    calibrator.update(raw, np.ones(200, dtype=bool))
    assert 0.4 < calibrator.rates(np.array([0.85]))[0] < 0.6


def test_calibrated_path_probabilities_never_rise_down_the_tree():
    planner = TreePlanner(max_nodes=16)
    tree = planner.plan(0, [chain([1, 2, 3], [0.5, 0.9, 0.9]), chain([4, 5], [0.3, 0.95])])
    path = planner.calibrator.path_probs(tree)
    assert np.all(path[1:] <= path[tree.parents[1:]] + 1e-12)


def test_planner_shrinks_to_plain_decoding_when_drafts_keep_failing():
    planner = TreePlanner(max_nodes=16, cost=CPU_CURVE)
    drafts = [chain([1, 2, 3, 4], [0.8, 0.85, 0.85, 0.85])]
    assert planner.plan(0, drafts).size > 1
    for _ in range(60):
        tree = planner.plan(0, drafts)
        planner.observe(tree, np.empty(0, dtype=np.int64), 0.0)
    assert planner.plan(0, drafts).size == 1


def test_measured_cost_grows_with_tree_size(tiny_llama):
    curve = measure_cost(tiny_llama, sizes=(1, 64), cache_len=32, repeats=2)
    assert curve.max_nodes == 64
    assert curve.seconds[64] >= curve.seconds[1] > 0


def test_history_drafter_replays_an_earlier_generation():
    history = HistoryDrafter()
    history.begin(np.array([5, 6]))
    history.end(np.array([7, 8, 9, 10, 11]))
    drafts = history.propose(np.array([1, 2, 8, 9]), max_len=3)
    assert drafts[0].tokens.tolist() == [10, 11]  # stops at the document's end


def test_history_drafter_evicts_the_oldest_documents():
    history = HistoryDrafter(max_tokens=64)
    for start in range(0, 400, 20):
        history.add(np.arange(start, start + 19))
    assert history.size <= 64
    assert history.propose(np.array([381, 382]), max_len=2)[0].tokens.tolist() == [383, 384]
    assert history.propose(np.array([1, 2]), max_len=2) == []


def test_a_repeated_task_gets_faster_with_output_history(tiny_llama):
    prompt = random_prompt(77, length=20)
    expected = tiny_llama.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=[])
    history = HistoryDrafter()
    planner = TreePlanner(max_nodes=16)
    runs = []
    for _ in range(2):
        stats = retrieval_draft.DecodeStats()
        out = tiny_llama.generate(
            prompt, max_new_tokens=40, custom_generate=retrieval_draft.generate, eos_token_id=[],
            drafters=[history], draft_planner=planner, draft_stats=stats,
        )
        assert torch.equal(out, expected)
        runs.append(stats.mean_accepted)
    assert runs[1] > 2 * runs[0]
