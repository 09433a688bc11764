"""The planner shares one tree width across B rows by expected tokens per second."""

import numpy as np
import pytest

from retrieval_draft.planning.cost import VerifyCost
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.planning.sizer import extended_cost

# The CPU curve of DESIGN.md (ms by new tokens): forwards over 16 tokens cost two single steps.
CPU = VerifyCost.from_points([1, 2, 4, 8, 16, 32, 64], [34, 37, 52, 61, 67, 83, 120], max_nodes=64)


def planner(tree_budget: int = 16) -> TreePlanner:
    return TreePlanner(tree_budget=tree_budget, cost=CPU)


def test_rows_without_good_drafts_fall_back_to_one_token_per_row():
    weak = [np.full(8, 0.05) for _ in range(4)]
    assert planner().width(weak) == 0


def test_one_grounded_row_buys_width_for_the_batch():
    sure = np.full(8, 0.95) ** np.arange(1, 9)  # a long chain the model will likely accept
    rows = [sure] + [np.empty(0)] * 3
    assert planner().width(rows) >= 4


def test_larger_batches_get_narrower_trees_for_the_same_drafts():
    good = np.full(8, 0.8) ** np.arange(1, 9)
    widths = [planner().width([good] * rows) for rows in (1, 4, 16)]
    assert widths[0] >= widths[1] >= widths[2]
    assert widths[0] > widths[2]


def test_the_curve_is_extended_along_its_last_slope_for_big_batches():
    longer = extended_cost(CPU, 16 * 17)
    assert longer.max_nodes == 16 * 17
    assert np.all(np.diff(longer.seconds) >= 0)
    slope = (CPU.seconds[64] - CPU.seconds[32]) / 32
    assert np.isclose(longer.seconds[100] - longer.seconds[64], 36 * slope)


def test_without_a_cost_curve_every_row_takes_its_budget():
    batch = TreePlanner(tree_budget=6)
    assert batch.width([np.full(10, 0.1)[:6], np.full(3, 0.1)]) == 6


def test_a_batchs_forward_times_correct_batches_only_and_outlive_the_planner():
    """One correction table for one and many rows, kept by whoever shares it (the plugin: the model's)."""
    from retrieval_draft.planning.cost import ObservedCost, VerifyCost
    from retrieval_draft.planning.planner import TreePlanner
    from retrieval_draft.planning.sizer import extended_cost

    curve = VerifyCost.from_points([1, 2, 64], [0.030, 0.040, 0.120])
    shared = ObservedCost()
    first = TreePlanner(tree_budget=8, cost=curve, observed=shared)
    for _ in range(5):
        first.observe_forward(8, 8 * 5, 0.300)  # 8 rows read 8 caches: slower than 40 tokens of one row
        first.observe_forward(1, 5, float(curve.seconds[5]))  # one row runs as measured
    later = TreePlanner(tree_budget=8, cost=curve, observed=shared)
    assert later.sizer.observed.apply(extended_cost(curve, 8 * 9), rows=8).seconds[40] == pytest.approx(0.300)  # 8 full trees
    assert later.sizer.observed.apply(curve, rows=1).seconds[5] == pytest.approx(curve.seconds[5])
    probs = [np.full(8, 0.3)] * 8
    assert later.width(probs) < TreePlanner(tree_budget=8, cost=curve).width(probs)


def expected_tokens_per_second(rows, curve, width):
    """A step of ``width`` draft nodes per row: every row's bonus plus its first ``width`` candidates'
    probabilities, over the forward of rows x (width + 1) tokens."""
    gains = sum(1.0 + probs[:width].sum() for probs in rows)
    return gains / curve.seconds[min(len(rows) * (width + 1), curve.max_nodes)]


@pytest.mark.parametrize("seed", range(6))
def test_the_width_is_the_one_that_pays_best_for_uneven_rows(seed):
    generator = np.random.default_rng(seed)
    rows = [np.sort(generator.uniform(0.0, 1.0, int(generator.integers(0, 12))))[::-1].copy()
            for _ in range(int(generator.integers(1, 6)))]
    if max(r.shape[0] for r in rows) == 0:
        rows[0] = np.array([0.5])
    sizer = planner(tree_budget=16)
    curve = extended_cost(CPU, len(rows) * 17)
    chosen = sizer.width(rows)
    rates = [expected_tokens_per_second(rows, curve, w) for w in range(max(r.shape[0] for r in rows) + 1)]
    assert rates[chosen] == pytest.approx(max(rates))


def test_a_size_band_no_forward_verified_is_tried_once_when_priced_like_the_verified_ones_it_would_pay():
    """A curve pricing trees dearly (a busy spell) is tested: once lone roots are verified, a tree
    whose size band no forward ran is tried if, at a lone root's price, it would pay 1.25x more;
    where each tried band costs what the curve said, the planner settles on lone roots."""
    from retrieval_draft.planning.cost import ObservedCost

    dear = VerifyCost.from_points([1, 2, 64], [0.030, 0.300, 2.000])
    sure = np.full(8, 0.9) ** np.arange(1, 9)
    tester = TreePlanner(tree_budget=8, cost=dear)
    assert tester.width([sure]) == 0  # nothing verified yet: the curve alone decides
    tester.observe_forward(1, 1, 0.030)  # lone roots run as priced
    tried = []
    while (width := tester.width([sure])) > 0 and len(tried) < 8:
        tried.append(width)
        tester.observe_forward(1, width + 1, float(dear.seconds[width + 1]))  # the curve was right
    bands = ObservedCost().size_bands(np.array(tried) + 1)
    assert tried and len(set(bands.tolist())) == len(tried)  # each band tried once
    assert tester.width([sure]) == 0
