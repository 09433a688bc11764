"""Cost-aware tree sizing, acceptance calibration and learning from outputs."""

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.draft import Draft, Drafter, Proposals
from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.planning.calibration import AcceptanceCalibrator
from retrieval_draft.planning.cost import VerifyCost
from retrieval_draft.planning.cost_probe import measure_cost
from retrieval_draft.planning.planner import TreePlanner
from tests.conftest import random_prompt

# CPU-like curve from shared/DESIGN.md: ms per forward over k new tokens.
CPU_CURVE = VerifyCost.from_points([1, 2, 4, 8, 16, 32, 64], [34, 37, 52, 61, 67, 83, 120])
FLAT_CURVE = VerifyCost.from_points([1, 64], [10, 11])


def chain(tokens, probs):
    return Draft(np.array(tokens), np.array(probs, dtype=float))


def best_size(curve: VerifyCost, probs: np.ndarray) -> int:
    """Draft nodes a planner on ``curve`` verifies for one row whose ranked candidates are ``probs``."""
    return TreePlanner(tree_budget=curve.max_nodes, cost=curve).width([probs])


def test_unlikely_drafts_are_not_worth_verifying_on_a_cpu():
    assert best_size(CPU_CURVE, np.array([0.05, 0.04, 0.03])) == 0


def test_likely_drafts_grow_the_tree():
    assert best_size(CPU_CURVE, np.full(8, 0.9)) == 8


def test_a_flat_gpu_like_curve_takes_more_nodes_than_a_steep_one():
    probs = np.sort(np.random.default_rng(0).uniform(0.0, 0.5, 40))[::-1]
    assert best_size(FLAT_CURVE, probs) > best_size(CPU_CURVE, probs)


def test_calibrator_moves_toward_the_observed_rate():
    calibrator = AcceptanceCalibrator(decay=1.0)
    raw = np.array([0.85])
    for _ in range(200):
        calibrator.record(raw, np.zeros(1), np.array([False]))  # always wrong
    assert calibrator.rates(raw)[0] < 0.05
    for _ in range(200):
        calibrator.record(raw, np.zeros(1), np.array([True]))  # always right
    assert 0.4 < calibrator.rates(raw)[0] < 0.6


def test_only_tokens_after_a_right_prefix_are_graded():
    planner = TreePlanner()
    planner.grader.grade(Proposals.of([("d", Draft(np.array([1, 2, 3, 4]), np.full(4, 0.5)))]), np.array([1, 9, 3, 4]))
    calibrator = planner.calibrator("d")
    assert calibrator.trials.sum() == 2  # depth 0 right, depth 1 wrong, deeper never tested
    assert calibrator.hits.sum() == 1


def test_planned_tree_probabilities_never_rise_down_the_tree():
    planner = TreePlanner(tree_budget=16)
    drafts = [("a", chain([1, 2, 3], [0.5, 0.9, 0.9])), ("b", chain([4, 5], [0.3, 0.95]))]
    tree = planner.plan([0], [Proposals.of(drafts)]).trees[0]
    assert tree.size == 6
    assert np.all(tree.probs[1:] <= tree.probs[tree.parents[1:]] + 1e-12)


def test_planner_shrinks_to_plain_decoding_when_drafts_keep_failing():
    planner = TreePlanner(tree_budget=16, cost=CPU_CURVE)
    drafts = [("lookup", chain([1, 2, 3, 4], [0.8, 0.85, 0.85, 0.85]))]
    assert planner.plan([0], [Proposals.of(drafts)]).trees[0].size > 1
    for _ in range(60):
        planner.plan([0], [Proposals.of(drafts)]).trees[0]
        planner.observe([Proposals.of(drafts)], [np.array([7])], 0.0)
    assert planner.plan([0], [Proposals.of(drafts)]).trees[0].size == 1


def test_a_reliable_drafter_wins_the_budget_from_a_confident_but_wrong_one():
    planner = TreePlanner(tree_budget=2)
    wrong = ("loud", chain([1, 2], [0.95, 0.95]))
    right = ("quiet", chain([5, 6], [0.3, 0.3]))
    assert planner.plan([0], [Proposals.of([wrong, right])]).trees[0].tokens[1:].tolist() == [1, 2]
    for _ in range(40):  # the pruned drafter is graded too, so it can win
        planner.plan([0], [Proposals.of([wrong, right])]).trees[0]
        planner.observe([Proposals.of([wrong, right])], [np.array([5, 6, 8])], 0.0)
    assert planner.plan([0], [Proposals.of([wrong, right])]).trees[0].tokens[1:].tolist() == [5, 6]


def test_cost_curve_interpolates_between_measured_points_and_never_falls():
    curve = VerifyCost.from_points([1, 4, 8], [10.0, 16.0, 12.0], max_nodes=8)
    assert curve.seconds[2] == pytest.approx(12.0)  # a third of the way from 10 to 16
    assert curve.seconds[8] == pytest.approx(16.0)  # a dip at 8 nodes is measurement noise
    assert curve.seconds[0] == curve.seconds[1]


def test_a_probe_slowed_by_other_work_is_timed_again(tiny_llama, monkeypatch):
    """Gemma-3-270M once measured 903 ms at 2 nodes against 160 ms at 1 and about 200 ms at 4:
    kept, the running maximum made every size from 2 to 64 cost 903 ms."""
    from retrieval_draft.planning import cost_probe as cost_module

    true = {1: 0.16, 2: 0.17, 4: 0.19, 8: 0.22}
    timed = []

    def fake_time_chain(tree_model, size, rng, repeats, warmups=1):
        timed.append(size)
        return 0.903 if size == 2 and timed.count(2) == 1 else true[size]  # busy only the first time

    monkeypatch.setattr(cost_module, "time_chain", fake_time_chain)
    curve = cost_module.measure_cost(tiny_llama, sizes=(1, 2, 4, 8), cache_len=16, repeats=1)
    assert timed.count(2) >= 2  # the spike was timed again
    assert curve.seconds[2] == pytest.approx(0.17) and curve.seconds[8] == pytest.approx(0.22)
    assert cost_module.spiked([0.16, 0.903, 0.19, 0.22]) == [1] and cost_module.spiked(list(true.values())) == []


def test_first_use_measurement_runs_a_handful_of_forwards_on_a_cpu(tiny_llama, monkeypatch):
    """A measurement over random chains (a batch's first call without a stored curve) runs the
    kernel's first forward untimed, one timed forward per probed size (two where the skinny kernel
    competes), a lone root beside each size above one token and one closing forward; no per-size
    warm-ups on a CPU."""
    from retrieval_draft.planning import cost_probe as cost_module

    forwards = []

    def fake_time_chain(tree_model, size, rng, repeats, warmups=1):
        forwards.append(repeats + warmups)
        return 0.1 + 0.01 * size  # steady and increasing: nothing is timed again

    monkeypatch.setattr(cost_module, "time_chain", fake_time_chain)
    curve = cost_module.measure_cost(tiny_llama)
    competing = [size for size in cost_module.PROBE_SIZES if size in cost_module.SKINNY_ROWS]
    lone_roots_beside = len(cost_module.PROBE_SIZES) - 1  # one before each size above one token
    assert sum(forwards) == 1 + len(cost_module.PROBE_SIZES) + len(competing) + lone_roots_beside + 1
    assert sum(forwards) <= 3 * len(cost_module.PROBE_SIZES) + 1
    assert curve.max_nodes == max(cost_module.PROBE_SIZES) and curve.steady


def test_a_kernel_probe_no_slower_than_a_smaller_plain_one_wins_untimed_against_plain(tiny_llama, monkeypatch):
    """A forward over more tokens never runs faster, so where the kernel's time at a size is at or
    below the slowest plain forward timed so far, the plain path loses without being timed there."""
    from retrieval_draft.planning import cost_probe as cost_module

    timed = []

    def fake_time_chain(tree_model, size, rng, repeats, warmups=1):
        kernel = bool(tree_model.skinny_sizes)
        timed.append((size, kernel))
        return 0.05 + 0.01 * size if kernel else 0.2 + 0.02 * size

    monkeypatch.setattr(cost_module, "time_chain", fake_time_chain)
    curve = cost_module.measure_cost(tiny_llama, sizes=(1, 2, 4, 8, 16, 32), cache_len=16, repeats=1)
    probes = timed[1:-1]  # after the kernel's untimed first forward, before the closing one
    assert [size for size, kernel in probes if not kernel] == [1, 32]  # 2-16: the kernel beat plain's 1-token 0.22 s
    assert [size for size, kernel in probes if kernel and size > 1] == [2, 4, 8, 16, 32]
    assert probes.count((1, True)) == 1 + 5  # the kernel's lone root, and one beside each larger size
    assert curve.skinny_sizes == frozenset(cost_module.SKINNY_ROWS)
    assert curve.seconds[16] == pytest.approx(0.21) and curve.seconds[32] == pytest.approx(0.37)


def test_measured_cost_has_a_positive_time_for_every_tree_size(tiny_llama):
    curve = measure_cost(tiny_llama, sizes=(1, 8, 64), cache_len=32, repeats=2)
    assert curve.max_nodes == 64
    assert np.all(np.isfinite(curve.seconds)) and np.all(curve.seconds > 0)


def test_history_drafter_replays_an_earlier_generation():
    history = HistoryDrafter()
    history.add(np.array([5, 6, 7, 8, 9, 10, 11]))
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
    planner = TreePlanner(tree_budget=16)
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


def test_a_prefix_shared_by_one_drafters_branches_is_graded_once():
    planner = TreePlanner(tree_budget=8)
    drafts = [("ngram", chain([1, 2], [0.5, 0.5])), ("ngram", chain([1, 3], [0.5, 0.5]))]
    planner.plan([0], [Proposals.of(drafts)]).trees[0]
    planner.observe([Proposals.of(drafts)], [np.array([1, 3, 4])], 0.0)
    calibrator = planner.calibrators["ngram"]
    assert calibrator.trials.sum() == 3  # token 1 once, then 2 (wrong) and 3 (right)
    assert calibrator.hits.sum() == 2


def test_siblings_conditional_probabilities_are_capped_at_one():
    from retrieval_draft.tree import merge_drafts
    from retrieval_draft.planning.planner import cap_siblings

    tree = cap_siblings(merge_drafts(0, [chain([1, 2], [0.9, 0.5]), chain([3], [0.9]), chain([4], [0.2])]))
    first_level = tree.probs[tree.parents == 0]
    assert first_level.sum() == pytest.approx(1.0)
    node_1, node_2 = 1, 2
    assert tree.probs[node_2] == pytest.approx(tree.probs[node_1] * 0.5)


def test_calibrator_buckets_separate_high_probabilities():
    calibrator = AcceptanceCalibrator(decay=1.0)
    sure, likely = np.array([0.98]), np.array([0.91])
    for _ in range(100):
        calibrator.record(sure, np.zeros(1), np.array([True]))
        calibrator.record(likely, np.zeros(1), np.array([False]))
    assert calibrator.rates(sure)[0] > 0.9
    assert calibrator.rates(likely)[0] < 0.1
    with pytest.raises(ValueError):
        AcceptanceCalibrator(edges=np.array([0.0, 0.6, 0.5, 1.0]))


def test_register_gives_each_drafter_its_own_prior_scale():
    class Measured(Drafter):
        name, prior_scale = "measured", 1.0

        def propose(self, context, max_len):
            return []

    class Heuristic(Measured):
        name, prior_scale = "heuristic", 0.5

    planner = TreePlanner()
    planner.register([Measured(), Heuristic()])
    raw = np.array([0.9])
    assert planner.calibrator("measured").rates(raw)[0] == pytest.approx(0.92)  # bucket [0.9, 0.94), believed
    assert planner.calibrator("heuristic").rates(raw)[0] == pytest.approx(0.46)  # half believed


def test_observed_forward_times_reshape_a_curve_measured_on_a_busy_machine():
    from retrieval_draft.planning.cost import ObservedCost

    busy = VerifyCost.from_points([1, 2, 64], [0.100, 0.160, 0.170])  # flat: big trees look nearly free
    observed = ObservedCost(min_count=3)
    for _ in range(5):
        observed.observe(busy, 1, 0.030)
        observed.observe(busy, 33, 0.090)
    fixed = observed.apply(busy)
    assert fixed.seconds[1] == pytest.approx(0.030)
    assert fixed.seconds[33] == pytest.approx(0.090)
    assert observed.drifted()
    probs = np.full(32, 0.05)  # 1.6 expected extra tokens from 32 nodes
    assert best_size(busy, probs) == 32  # the busy curve says: verify everything
    assert best_size(fixed, probs) == 0  # the observed curve says: plain decoding
    kept = observed.proven_cheaper(busy)  # worth keeping on disk: the idle machine is faster than that curve
    assert kept.seconds[1] == pytest.approx(0.030) and kept.seconds[33] == pytest.approx(0.090)


def test_forward_times_after_a_long_prompt_correct_only_long_caches():
    from retrieval_draft.planning.cost import ObservedCost

    curve = VerifyCost.from_points([1, 2, 64], [0.030, 0.040, 0.120])  # measured after 256 tokens
    observed = ObservedCost()
    for _ in range(5):
        observed.observe(curve, 1, 0.030, cache_len=200)  # short prompts run as measured
        observed.observe(curve, 17, 0.150, cache_len=6000)  # trees after 6k tokens cost twice as much
    assert observed.apply(curve, cache_len=300).seconds[17] == pytest.approx(curve.seconds[17])
    assert observed.apply(curve, cache_len=5000).seconds[17] == pytest.approx(0.150)
    assert observed.apply(curve, cache_len=9000).seconds[17] == pytest.approx(0.150)  # nearest shorter band
    probs = np.full(16, 0.3)  # 4.8 expected extra tokens from 16 nodes
    planner = TreePlanner(tree_budget=16, cost=curve, observed=observed)
    assert planner.width([probs], cache_len=6000) < planner.width([probs], cache_len=300) == 16


def test_a_busy_spell_is_corrected_in_memory_but_never_kept_on_disk(tmp_path, monkeypatch):
    from retrieval_draft.cache_dir import CACHE_ENV
    from retrieval_draft.sessions.memory import PluginMemory
    from retrieval_draft.planning.cost import ObservedCost
    from retrieval_draft.planning.cost_file import cost_key, cost_path
    from tests.conftest import make_tiny_llama

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model = make_tiny_llama()
    memory = PluginMemory(persist=True)
    idle = VerifyCost.from_points([1, 2, 64], [0.030, 0.040, 0.120])
    memory.model(model).cost = idle
    slow = ObservedCost(min_count=3)
    for _ in range(5):
        slow.observe(idle, 1, 0.300)  # ten times slower: other work shares the cores
    memory.model(model).observed = slow
    assert slow.drifted() and slow.proven_cheaper(idle) is None
    memory.save_learned(model, force=True)
    assert not cost_path(cost_key(model)).exists()
    assert slow.apply(idle).seconds[1] > idle.seconds[1]  # this process still plans with what it sees


def _first_tested_by_rule(tokens, depths, owners, lengths, matched, truth):
    """``first_tested``'s rule written out in Python: each draft's entries through its first wrong
    one, the first of equal (owner, depth, token), in a stable order by owner."""
    tested, seen, start = [], set(), 0
    for length, right_count in zip(lengths, matched):
        limit = min(length, len(truth))
        for j in range(start, start + (right_count + 1 if right_count < limit else limit)):
            key = (owners[j], depths[j], tokens[j])
            if key not in seen:
                seen.add(key)
                tested.append(j)
        start += length
    first = sorted(tested, key=lambda j: owners[j])
    return first, [depths[j] < len(truth) and tokens[j] == truth[depths[j]] for j in first]


def test_the_graded_entries_are_the_first_tested_of_each_kind_ordered_by_owner():
    from retrieval_draft.planning.planner import first_tested

    rng = np.random.default_rng(11)
    for _ in range(400):
        drafts = int(rng.integers(0, 6))
        lengths = rng.integers(1, 6, size=drafts)
        m = int(lengths.sum())
        tokens, owners = rng.integers(0, 3, size=m), rng.integers(0, 4, size=m)
        depths = np.concatenate([np.arange(n) for n in lengths]) if drafts else np.zeros(0, np.int64)
        truth = rng.integers(0, 3, size=int(rng.integers(1, 6)))
        matched = rng.integers(0, 6, size=drafts)
        first, right = first_tested(tokens, depths, owners, lengths.astype(np.int64), matched, truth)
        want_first, want_right = _first_tested_by_rule(tokens, depths, owners, lengths, matched, truth)
        assert first.tolist() == want_first and right.tolist() == want_right


def test_the_width_paying_best_is_numpys_argmax_of_tokens_per_second():
    from retrieval_draft.planning.sizer import best_rate

    rng = np.random.default_rng(5)
    cases = [(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0])),  # ties: the first
             (np.array([1.0, np.nan, 5.0]), np.ones(3)),  # a NaN rate: the first NaN
             (np.array([1.0, 2.0]), np.array([1.0, 0.0])),  # a zero price: infinitely many tokens a second
             (np.array([0.0, 1.0]), np.array([0.0, 1.0]))]  # 0 / 0
    cases += [(rng.integers(0, 4, 8).astype(float), rng.integers(1, 4, 8).astype(float)) for _ in range(200)]
    for gains, seconds in cases:
        with np.errstate(divide="ignore", invalid="ignore"):
            assert best_rate(gains, seconds) == int(np.argmax(gains / seconds)), (gains, seconds)


def test_a_wider_tree_is_explored_only_where_some_sizes_were_verified_and_others_not():
    from retrieval_draft.planning.sizer import EXPLORE_GAIN, explored_width

    gains, seconds = np.array([1.0, 3.0, 6.0]), np.array([1.0, 2.0, 4.0])
    best = 1  # 1.5 tokens a unit; the widest, priced at the verified 1.0, would give 6.0
    assert explored_width(gains, seconds, np.array([True, True, True]), best) == best  # nothing to test
    assert explored_width(gains, seconds, np.array([False, False, False]), best) == best  # nothing to price it by
    assert explored_width(gains, seconds, np.array([True, True, False]), best) == 2
    assert explored_width(gains, seconds, np.array([False, True, True]), 2) == 2  # the narrowest: 1.0 a unit, too little
    assert 6.0 / 1.0 > EXPLORE_GAIN * 1.5
