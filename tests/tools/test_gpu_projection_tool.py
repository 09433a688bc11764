"""tools.bench.gpu_projection: a flat cost curve lets the planner take every candidate, and the projection is the stated formula."""

from __future__ import annotations

import numpy as np
import pytest

from tools.bench.gpu_projection import FLAT_NODES, flat_planner, project


def test_a_flat_curve_takes_every_candidate_up_to_64_nodes_and_ignores_cpu_times():
    planner = flat_planner(0.008)
    ranked = [np.linspace(0.9, 0.01, FLAT_NODES)]  # plan() passes at most tree_budget candidates per row
    assert planner.width(ranked) == FLAT_NODES
    for _ in range(20):
        planner.observe_forward(1, 65, 1.0)  # this CPU's slow big forwards must not reshape the GPU curve
    assert planner.width(ranked) == FLAT_NODES


def test_the_projection_is_mat_times_the_host_ratio():
    row = {"mat": 3.0, "host_ms": 2.0, "host_without_readout_ms": 1.0}
    projected = project(row, hf_host_ms=1.0, forward_ms=[8.0])
    assert projected["T=8ms"] == pytest.approx(3.0 * 9.0 / 10.0)
    assert projected["T=8ms, readout on the device"] == pytest.approx(3.0 * 9.0 / 9.0)
