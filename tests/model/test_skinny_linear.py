"""The skinny float32 matmul used for 1-64-token forwards on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval_draft.tree import DraftTree
from retrieval_draft.planning.cost_probe import kernel_sizes, measure_cost
from retrieval_draft.model.skinny_linear import (
    SKINNY_ROWS, KernelThreads, eligible_linears, skinny_forwards, skinny_linear, skinny_linears, skinny_matmul,
)
from retrieval_draft.model.tree_model import TreeModel

from tests.conftest import make_tiny_llama, random_prompt


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16])
@pytest.mark.parametrize("width", [4, 13, 64, 130])
@pytest.mark.parametrize("depth", [37, 131])  # below and above ROW_BY_ROW_DEPTH
@pytest.mark.parametrize("row_by_row", [False, True])  # both loops for up to 8 rows of 131
def test_skinny_matmul_matches_torch(rows, width, depth, row_by_row):
    rng = np.random.default_rng(rows * 1000 + width)
    x = rng.standard_normal((rows, depth), dtype=np.float32)
    w = rng.standard_normal((width, depth), dtype=np.float32)
    out = np.full((rows, width), np.nan, dtype=np.float32)
    skinny_matmul(x, w, out, row_by_row)
    expected = (torch.from_numpy(x).double() @ torch.from_numpy(w).double().T).float().numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_skinny_linear_keeps_leading_dims_and_bias():
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 10, bias=True)
    x = torch.randn(1, 6, 24)
    with torch.no_grad():
        got = skinny_linear(layer, x)
        torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5)
    assert got.shape == (1, 6, 10)


def test_routing_is_scoped_and_skips_hooked_or_other_layers():
    model = make_tiny_llama()
    linears = eligible_linears(model)
    assert len(linears) == 2 * 7 + 1  # q k v o gate up down per layer, plus lm_head
    hooked = linears[0]
    hooked.forward = lambda x: x  # what an offloading hook looks like: an instance-level forward
    assert hooked not in eligible_linears(model)
    del hooked.forward
    forwards = skinny_forwards(linears)
    with skinny_linears(forwards):
        assert all("forward" in vars(m) for m in linears)
    assert not any("forward" in vars(m) for m in linears)
    with pytest.raises(RuntimeError), skinny_linears(forwards):
        raise RuntimeError("inside")
    assert not any("forward" in vars(m) for m in linears)


@pytest.mark.parametrize("row_by_row", [False, True])
def test_tree_forward_with_kernel_matches_plain_linear(row_by_row):
    """Logits of an 8-node tree through the kernel (either loop) equal those through MKL to float32
    rounding."""
    model = make_tiny_llama(seed=3)  # its down projections hold 128 values a weight row: the row-by-row loop takes them
    tree = DraftTree(
        tokens=np.array([5, 6, 7, 8, 9, 10, 11, 12]),
        parents=np.array([-1, 0, 1, 2, 0, 4, 5, 1]),
        depths=np.array([0, 1, 2, 3, 1, 2, 3, 2]),
        probs=np.ones(8),
    )
    prompt = random_prompt(1)
    fast = TreeModel(model)
    fast.row_by_row = row_by_row
    assert fast._skinny and all(forward.args[2] is row_by_row for _, forward in fast._skinny)
    fast.prefill(prompt)
    plain = TreeModel(model)
    plain._skinny = []
    plain.prefill(prompt)
    torch.testing.assert_close(fast.score_trees([tree]), plain.score_trees([tree]), rtol=1e-4, atol=1e-5)


def test_kernel_sizes_follow_the_nearest_probe_below():
    wins = {4: True, 6: False, 8: True, 12: True, 16: False}
    assert kernel_sizes(wins) == frozenset({4, 5, 8, 9, 10, 11, 12, 13, 14, 15})
    assert kernel_sizes({}) == frozenset()


def test_measured_cost_picks_the_path_per_size_and_tree_model_obeys(monkeypatch):
    from retrieval_draft.planning import cost_probe

    model = make_tiny_llama(seed=5)
    monkeypatch.setattr(cost_probe, "walks_faster", lambda linears: True)  # a machine where walking wins
    loops = []
    real = TreeModel.score_trees
    monkeypatch.setattr(TreeModel, "score_trees", lambda self, trees: loops.append(self.row_by_row) or real(self, trees))
    cost = measure_cost(model, sizes=(1, 4, 8), cache_len=16, repeats=1)
    assert cost.row_by_row and loops and all(loops)  # every timed forward ran the machine's loop, which the curve keeps
    assert cost.skinny_sizes is not None and cost.skinny_sizes <= frozenset(SKINNY_ROWS)
    tree_model = TreeModel(model, skinny_sizes=frozenset({5}))
    assert tree_model.skinny_sizes == frozenset({5})
    assert TreeModel(model).skinny_sizes == frozenset(SKINNY_ROWS)


def test_routing_leaves_torchs_thread_count_as_the_caller_set_it():
    """In a new process with OMP_NUM_THREADS=1 (Numba's OpenMP pool not started yet), a forward
    through the kernel leaves torch on the one thread the caller asked for: torch's count read once
    before (as the cost curve's key does), Numba's pool used to move it to every core."""
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "torch.set_num_threads(1)\n"
        "assert torch.get_num_threads() == 1\n"
        "from retrieval_draft.model.skinny_linear import eligible_linears, skinny_forwards, skinny_linears\n"
        "layer = torch.nn.Linear(8, 4)\n"
        "with torch.no_grad(), skinny_linears(skinny_forwards(eligible_linears(layer))):\n"
        "    inside = torch.get_num_threads()\n"
        "    layer(torch.ones(2, 8))\n"
        "print(inside, torch.get_num_threads())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "1"]


def test_a_forward_that_did_not_get_its_threads_cores_sends_the_next_ones_to_one_thread():
    pacing = KernelThreads()
    assert pacing.count(2) == 2
    pacing.observe(2, wall_s=0.15, cpu_s=0.16)  # the first forward: loading the kernel on one thread, not judged
    assert pacing.count(2) == 2
    pacing.observe(2, wall_s=0.1, cpu_s=0.196)  # both threads busy: a quiet machine
    assert pacing.count(2) == 2
    pacing.observe(2, wall_s=0.1, cpu_s=0.096)  # half its threads' time: a busy machine
    counts = []
    for _ in range(KernelThreads.RETRY):
        counts.append(pacing.count(2))
        pacing.observe(counts[-1], wall_s=0.1, cpu_s=0.09)
    assert counts == [1] * KernelThreads.RETRY and pacing.count(2) == 2  # then two threads are tried again
    pacing.observe(1, wall_s=0.1, cpu_s=0.01)  # a one-thread forward says nothing about contention
    assert pacing.count(2) == 2


def test_the_kernel_runs_on_the_threads_pacing_gives_and_is_timed_for_it(monkeypatch):
    import numba

    model = make_tiny_llama()
    forwards = skinny_forwards(eligible_linears(model))
    seen, observed = [], []

    class Recording(KernelThreads):
        def observe(self, threads, wall_s, cpu_s):
            observed.append((threads, wall_s >= 0, cpu_s >= 0))

    pacing = Recording()
    pacing.single_left = 3
    with skinny_linears(forwards, pacing):
        seen.append(numba.get_num_threads())
    assert seen == [1] and observed == [(1, True, True)]


def test_walks_faster_says_which_loop_multiplies_the_weights_faster(monkeypatch):
    """The choice follows the timings: a loop made slow loses (both loops are timed over the same
    weights, alternated); a model with no weight row long enough to walk keeps the blocked loop."""
    import time

    from retrieval_draft.model import skinny_linear as kernel

    linears = eligible_linears(torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.Linear(64, 256)))
    for slow in ("_row_by_row", "_blocked"):
        with monkeypatch.context() as patch:
            loop = getattr(kernel, slow)
            patch.setattr(kernel, slow, lambda x, w, out, loop=loop: (time.sleep(0.002), loop(x, w, out)))
            assert kernel.walks_faster(linears) is (slow == "_blocked")
    assert kernel.walks_faster(eligible_linears(torch.nn.Linear(64, 64))) is False
