"""The calibrator's compiled cell lookups agree with the rule they implement, written out in numpy."""

import numpy as np

from retrieval_draft.draft import Draft, Proposals
from retrieval_draft.planning.calibration import DEPTH_BANDS, PROB_EDGES, AcceptanceCalibrator
from retrieval_draft.planning.planner import TreePlanner


def _cells(raw, depths):
    bucket = np.clip(np.searchsorted(PROB_EDGES, raw, side="right") - 1, 0, PROB_EDGES.shape[0] - 2)
    return np.searchsorted(DEPTH_BANDS, depths, side="right") - 1, bucket


def test_record_counts_each_token_in_its_cell_and_rates_shrink_cells_toward_their_pooled_bucket():
    rng = np.random.default_rng(0)
    calibrator = AcceptanceCalibrator(prior_weight=3.0, prior_scale=0.6)
    raw = np.concatenate([rng.random(200), [0.0, 1.0, 0.995]])  # the edges' ends land in the end buckets
    depths = rng.integers(0, 12, size=raw.shape[0])
    right = rng.random(raw.shape[0]) < raw
    calibrator.record(raw, depths, right)
    band, bucket = _cells(raw, depths)
    trials, hits = np.zeros_like(calibrator.trials), np.zeros_like(calibrator.hits)
    np.add.at(trials, (band, bucket), 1.0)
    np.add.at(hits, (band[right], bucket[right]), 1.0)
    assert np.array_equal(calibrator.trials, trials) and np.array_equal(calibrator.hits, hits)

    w = 3.0
    pooled = (hits.sum(0) + w * 0.6 * calibrator.centers) / (trials.sum(0) + w)
    expected = (hits[band, bucket] + w * pooled[bucket]) / (trials[band, bucket] + w)
    np.testing.assert_allclose(calibrator.rates(raw, depths), expected, rtol=1e-12)
    # one draft's tokens: depths 0..n-1
    np.testing.assert_allclose(calibrator.rates(raw[:5]), calibrator.rates(raw[:5], np.arange(5)), rtol=0)


def test_grading_one_draft_tests_through_its_first_wrong_token():
    planner = TreePlanner()
    planner.grader.grade(Proposals.of([("d", Draft(np.array([1, 2, 3, 4]), np.full(4, 0.95)))]), np.array([1, 2, 9, 4]))
    calibrator = planner.calibrator("d")
    band, bucket = _cells(np.full(3, 0.95), np.arange(3))
    assert calibrator.trials.sum() == 3 and calibrator.hits.sum() == 2
    assert np.all(calibrator.trials[band, bucket] == 1) and calibrator.hits[band[2], bucket[2]] == 0


def test_a_cells_edge_lookup_is_numpys_searchsorted_from_the_right():
    from retrieval_draft.planning.calibration import _at_or_below

    rng = np.random.default_rng(3)
    for edges in (PROB_EDGES, DEPTH_BANDS, np.array([0.5]), np.sort(rng.random(7))):
        values = [*edges, *(edges + 1e-9), *(edges - 1e-9), -1.0, 2.0, np.inf, -np.inf, np.nan, *rng.random(20)]
        for value in values:
            assert _at_or_below(edges, value) == np.searchsorted(edges, value, side="right"), (edges, value)
    for depth in range(-2, 40):
        assert _at_or_below(DEPTH_BANDS, depth) == np.searchsorted(DEPTH_BANDS, depth, side="right")
