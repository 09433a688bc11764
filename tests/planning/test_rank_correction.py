"""The merged tree's ranks, graded by what they delivered, correct how big the planner makes a tree."""

import numpy as np

from retrieval_draft.draft import Draft, Proposals
from retrieval_draft.planning.calibration import RankCorrection
from retrieval_draft.planning.cost import VerifyCost
from retrieval_draft.planning.planner import confirmed_nodes
from retrieval_draft.planning.planner import TreePlanner


def test_the_steps_tokens_confirm_refute_or_leave_undecided_each_candidate_node():
    # root -> 5 -> 6, root -> 5 -> 9 -> 4, root -> 7 -> 8; the model gave 5, then the bonus 9
    tokens = np.array([1, 5, 6, 7, 9, 4, 8])
    parents = np.array([-1, 0, 1, 0, 1, 4, 3])
    depths = np.array([0, 1, 2, 1, 2, 3, 2])
    decided, confirmed = confirmed_nodes(tokens, parents, depths, np.array([5, 9]))
    assert confirmed.tolist() == [True, True, False, False, True, False, False]
    # 4 lies below the bonus token, which the model's tokens say nothing after; 8 lies below refuted 7
    assert decided.tolist() == [True, True, True, True, True, False, True]


def test_ranks_that_deliver_less_than_promised_are_scaled_down_and_the_rest_stay():
    ranks = RankCorrection()
    assert np.allclose(ranks.factors(12), 1.0)  # nothing observed: the probabilities stand
    for _ in range(200):
        ranks.record(np.arange(1, 13), np.full(12, 0.5), np.arange(1, 13) <= 2)
    factors = ranks.factors(12)
    assert factors[0] > 1.5 and factors[1] > 1.5  # ranks 1-2 delivered every time, promised half
    assert np.all(factors[8:] < 0.1)  # ranks 9-12 never delivered


def test_a_planner_that_saw_its_lower_ranks_fail_verifies_a_smaller_tree():
    curve = VerifyCost.from_points([1, 64], [0.03, 0.03 + 63 * 0.002])  # 2 ms a node after 30 ms
    drafts = [("prompt", Draft(np.array([10 + i]), np.array([0.9 if i == 0 else 0.4]))) for i in range(8)]
    fresh = TreePlanner(tree_budget=16, cost=curve)
    taught = TreePlanner(tree_budget=16, cost=curve)
    for _ in range(300):
        (full, order), = taught.plan([1], [Proposals.of(drafts)]).candidates
        taught.grader.grade_ranks(full, order, np.array([10, 3]))  # only the first guess ever holds
    assert taught.plan([1], [Proposals.of(drafts)]).trees[0].size < fresh.plan([1], [Proposals.of(drafts)]).trees[0].size
    assert taught.plan([1], [Proposals.of(drafts)]).trees[0].size >= 2  # the reliable node stays
