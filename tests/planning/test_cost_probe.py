"""The cost curve measured from decoding's own forwards: the probe's schedule, the planner that
serves it, and the plugin's first call that measures nothing before it decodes."""

import numpy as np
import pytest
import torch

import retrieval_draft
import retrieval_draft.decode.engine as engine
import retrieval_draft.planning.cost_probe as cost_probe
from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.draft import Draft, Proposals
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.planning.cost_file import load_cost
from retrieval_draft.planning.cost_probe import AGAIN, REF, SETTLE, SETUP, TIME, CostProbe, Probe
from retrieval_draft.planning.planner import TreePlanner
from tests.conftest import make_tiny_llama, random_prompt


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """No curve stored by another test's same-shaped model."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


def run_schedule(probe: CostProbe, seconds) -> list[Probe]:
    """Serve ``probe`` until complete with ``seconds(probe)``; the forwards it asked for."""
    asked = []
    while (wanted := probe.pending()) is not None:
        asked.append(wanted)
        probe.record(wanted, seconds(wanted))
        assert len(asked) < 50
    return asked


def test_the_schedule_sets_up_the_kernel_times_each_size_and_settles():
    probe = CostProbe(sizes=(1, 2, 4), kernel_possible=True)
    kernel = {1: 0.05, 2: 0.30, 4: 0.07}  # the 2-token kernel forward ran while the cores were busy
    plain = {1: 0.08, 2: 0.09, 4: 0.12}
    again = []

    def seconds(p):
        if p.role == AGAIN:
            again.append(p.tokens)
            return 0.06
        return (kernel if p.kernel else plain)[p.tokens]

    asked = run_schedule(probe, seconds)
    assert asked[0] == Probe(1, True, SETUP)
    timed = [(p.tokens, p.kernel) for p in asked if p.role == TIME]
    # size 4: the kernel's 0.07 s beat the slowest smaller plain forward (0.09 s), so plain is not timed there
    assert timed == [(1, True), (1, False), (2, True), (2, False), (4, True)]
    assert again == []  # 2 tokens went plain (0.09 s): no spike among the faster paths
    assert asked[-1].role == SETTLE and asked[-1] == Probe(1, True, SETTLE)
    curve = probe.curve()
    assert curve.seconds[1] == pytest.approx(0.05) and curve.seconds[2] == pytest.approx(0.09)
    assert curve.seconds[4] == pytest.approx(0.09)  # 0.07 raised to the smaller sizes' level
    assert 1 in curve.skinny_sizes and 2 not in curve.skinny_sizes and 4 in curve.skinny_sizes and curve.steady


def test_a_spiked_size_is_timed_again_and_a_busy_close_is_not_steady():
    probe = CostProbe(sizes=(1, 2, 4), kernel_possible=False)
    times = {1: 0.05, 2: 0.20, 4: 0.08}
    asked = run_schedule(probe, lambda p: {AGAIN: 0.06, SETTLE: 0.09}.get(p.role, times[p.tokens]))
    assert [p.tokens for p in asked if p.role == AGAIN] == [2]
    assert probe.curve().seconds[2] == pytest.approx(0.06)
    assert not probe.curve().steady  # the closing forward took 0.09 s against the first 0.05 s


def test_a_partial_curve_covers_the_sizes_timed_so_far():
    probe = CostProbe(sizes=(1, 2, 4, 8), kernel_possible=False)
    assert probe.curve() is None
    probe.record(probe.pending(), 0.05)
    assert probe.pending() == Probe(1, False, REF, serves=2)  # the lone root beside size 2
    probe.record(probe.pending(), 0.05)
    probe.record(probe.pending(), 0.06)
    assert probe.pending() == Probe(1, False, REF, serves=4)
    probe.record(probe.pending(), 0.05)
    assert probe.pending() == Probe(4, False, TIME) and not probe.complete
    assert probe.curve().max_nodes == 2 and probe.curve().seconds[2] == pytest.approx(0.06)


def test_a_spell_that_slows_a_size_and_its_lone_root_alike_leaves_the_shape():
    """Each size is kept as its ratio to the lone root timed just before it: a busy spell over
    the 4- and 8-token probes (both ten times slower, their lone roots too) changes nothing."""
    probe = CostProbe(sizes=(1, 2, 4, 8), kernel_possible=False)
    idle = {1: 0.05, 2: 0.06, 4: 0.07, 8: 0.09}
    spell = {4, 8}  # the sizes whose forwards (and the lone roots beside them) ran in the spell

    def seconds(p):
        slow = 10.0 if (p.role == REF and p.serves in spell) or (p.role != REF and p.tokens in spell) else 1.0
        return slow * idle[p.tokens]

    asked = run_schedule(probe, seconds)
    assert [p.serves for p in asked if p.role == REF] == [2, 4, 8]
    curve = probe.curve()
    assert curve.seconds[4] == pytest.approx(0.07) and curve.seconds[8] == pytest.approx(0.09)
    assert curve.seconds[1] == pytest.approx(0.05)  # the fastest lone root: the idle machine's


def candidates(n: int) -> list:
    """One row's drafts: a chain of ``n`` likely tokens."""
    return [Proposals.of([("prompt", Draft(np.arange(10, 10 + n), np.full(n, 0.9)))])]


def test_a_planner_verifies_the_probed_sizes_and_routes_each_through_the_probed_path():
    probe = CostProbe(sizes=(1, 2, 4), kernel_possible=True)
    planner = TreePlanner(tree_budget=8, probe=probe)
    seen = []
    for _ in range(20):
        wanted = probe.pending()
        plan = planner.plan([1], candidates(8))
        tree = plan.trees[0]
        seen.append((wanted, tree.size, plan.matmul_sizes))
        planner.observe_forward(1, tree.size, 0.01 * tree.size + (0.005 if wanted.kernel else 0.02), plan=plan)
        if planner.probe is None:
            break
    assert probe.complete and planner.probe is None and planner.cost is not None
    for wanted, size, matmul in seen:
        assert size == wanted.tokens  # each step verified the forward the probe wanted
        assert (size in matmul) == wanted.kernel
    # done: the curve's own paths (the kernel won everywhere here), and its forwards now correct it
    plan = planner.plan([1], candidates(8))
    assert plan.matmul_sizes == planner.cost.skinny_sizes and 4 in planner.cost.skinny_sizes
    planner.observe_forward(1, 3, 0.5, plan=plan)
    assert planner.sizer.observed.count.sum() == 1


def test_a_step_whose_candidates_cannot_fill_the_probe_is_planned_and_not_recorded():
    probe = CostProbe(sizes=(1, 8), kernel_possible=False)
    probe.record(probe.pending(), 0.05)  # size 1 timed
    probe.record(probe.pending(), 0.05)  # and the lone root beside 8: 8 is next
    planner = TreePlanner(tree_budget=8, probe=probe)
    plan = planner.plan([1], candidates(3))
    tree = plan.trees[0]
    assert tree.size <= 4 and plan.matmul_sizes is None and plan.probing is None
    planner.observe_forward(1, tree.size, 9.0, plan=plan)
    assert probe.pending() == Probe(8, False, TIME) and probe.plain == {1: 0.05}


def test_a_budget_below_the_probes_sizes_stops_probing_and_lets_decoding_correct_the_curve():
    probe = CostProbe(sizes=(1, 2, 4, 8, 16, 32), kernel_possible=False)
    planner = TreePlanner(tree_budget=6, probe=probe)  # trees of 7 nodes at most: 8, 16 and 32 never fit
    for _ in range(10):
        plan = planner.plan([1], candidates(8))
        tree = plan.trees[0]
        planner.observe_forward(1, tree.size, 0.01 * tree.size, plan=plan)
        if planner.probe is None:
            break
    assert planner.probe is None and sorted(probe.plain) == [1, 2, 4] and not probe.complete
    assert planner.cost.max_nodes == 4
    before = planner.sizer.observed.count.sum()
    plan = planner.plan([1], candidates(8))
    planner.observe_forward(1, plan.trees[0].size, 0.5, plan=plan)
    assert planner.sizer.observed.count.sum() == before + 1  # decoding's forwards now correct the curve


class SteadyTimer:
    """Stands in for the decode loop's ``ForwardTimer``: every forward takes 10 ms."""

    def __init__(self, device) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def seconds(self) -> float:
        return 0.01


def test_the_first_call_measures_the_curve_from_its_own_forwards(monkeypatch):
    """No measurement before decoding on one row: the call's forwards complete the probe (small
    sizes here, so a short random-weight generation fills them), the output is HF's, and the
    curve is kept for the next process; a batch call with no curve still measures first."""
    def no_measurement(*args, **kwargs):
        raise AssertionError("measured before decoding")

    monkeypatch.setattr(cost_probe, "measure_cost", no_measurement)
    monkeypatch.setattr(engine, "ForwardTimer", SteadyTimer)  # a steady machine, whatever this one is doing
    model = make_tiny_llama(seed=41)
    memory = PluginMemory(persist=False)
    memory.model(model).probe = CostProbe(sizes=(1, 2, 4), kernel_possible=True)
    prompt = random_prompt(7, repeat=3)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False)
    probe_forwards = []  # per call: forwards that timed a size for the probe (``DecodeStats.probe_forwards``)
    for _ in range(3):
        stats = retrieval_draft.DecodeStats()
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
            custom_generate=retrieval_draft.generate, draft_memory=memory, draft_stats=stats,
        )
        assert torch.equal(out, expected)
        probe_forwards.append(stats.probe_forwards)
        if memory.model(model).cost is not None:
            break
    learned = memory.model(model)
    assert learned.probe is None and learned.cost.max_nodes == 4
    assert sum(probe_forwards) >= 4  # sizes 2 and 4 at least once each way, lone roots beside them
    stats = retrieval_draft.DecodeStats()
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
                   custom_generate=retrieval_draft.generate, draft_memory=memory, draft_stats=stats)
    assert stats.forwards > 0 and stats.probe_forwards == 0  # the curve is known: no forward probes
    stored = load_cost(model)
    assert learned.cost.steady and stored is not None  # measured on a steady machine: kept for the next process
    assert np.allclose(stored.seconds, learned.cost.seconds)

    batch_model = make_tiny_llama(seed=42, vocab_size=96)  # another shape: nothing stored for it
    measured = []
    monkeypatch.setattr(cost_probe, "measure_cost", lambda model, probe=None: measured.append(probe) or learned.cost)
    prompts = torch.cat([random_prompt(8, vocab_size=96), random_prompt(9, vocab_size=96)])
    batch_model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=4, do_sample=False,
                         custom_generate=retrieval_draft.generate, draft_memory=memory)
    assert len(measured) == 1 and memory.model(batch_model).cost is learned.cost
