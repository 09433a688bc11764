"""tools.bench.gpu_projection: a flat cost curve lets the planner take every candidate, and the projection is the stated formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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


def test_sampling_runs_the_same_trees_with_the_stated_sampling_and_reports_mat(tiny_llama):
    """``--sampling``: each call samples at ``SAMPLING`` (T 0.7, top-p 0.9), seeded, on fixed 64-node trees."""
    import copy

    from tests.conftest import random_prompt
    from tools.bench import gpu_projection

    seen = []

    def handle():
        model = copy.copy(tiny_llama)
        real = model.generate

        def generate(*args, **kwargs):
            seen.append({key: kwargs.get(key) for key in ("do_sample", "temperature", "top_p", "tree_budget")})
            return real(*args, **kwargs)

        model.generate = generate
        return model

    prompts = [random_prompt(1, repeat=3)]
    first = gpu_projection.run_system(handle(), prompts, 12, None, None, sampling=True)
    again = gpu_projection.run_system(handle(), prompts, 12, None, None, sampling=True)
    assert len(seen) == 2 and all(
        s == {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "tree_budget": FLAT_NODES} for s in seen)
    assert first["mat"] >= 1.0 and first["forwards"] >= 1
    assert torch.equal(first["outputs"][0], again["outputs"][0])  # seeded per call
