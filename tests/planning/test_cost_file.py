"""The forward-cost curve is kept on disk per model shape and machine; bad files are re-measured."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import retrieval_draft.planning.cost_file as cost_file
import retrieval_draft.planning.cost_probe as cost_probe
from retrieval_draft.cache_dir import CACHE_ENV, cache_root
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft.planning.cost import VerifyCost, implausible_sizes, plausible
from tests.conftest import make_tiny_llama

CURVE = VerifyCost.from_points([1, 8, 64], [0.01, 0.02, 0.05], skinny_sizes=frozenset({4, 8}))


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    measured = []

    def fake_measure(model, probe=None):
        measured.append(model)
        return CURVE

    monkeypatch.setattr(cost_probe, "measure_cost", fake_measure)
    return measured


def test_a_new_process_reads_the_curve_instead_of_measuring(cache):
    model = make_tiny_llama(seed=31)
    assert PluginMemory().cost(model) is not None
    again = PluginMemory().cost(make_tiny_llama(seed=32))  # same shape, other weights, fresh memory
    assert len(cache) == 1
    assert np.allclose(again.seconds, CURVE.seconds) and again.skinny_sizes == CURVE.skinny_sizes


def test_a_corrupt_curve_file_is_ignored_and_replaced(cache):
    model = make_tiny_llama(seed=33)
    path = cost_file.cost_path(cost_file.cost_key(model))
    path.parent.mkdir(parents=True)
    for damaged in (b"{not json", b'{"key": 1}', b"\x00\xff"):
        path.write_bytes(damaged)
        PluginMemory().cost(model)
    assert len(cache) == 3
    assert cost_file.read_cost(path, cost_file.cost_key(model)) is not None  # rewritten whole


def test_a_curve_with_negative_or_decreasing_times_is_ignored(cache):
    model = make_tiny_llama(seed=34)
    key = cost_file.cost_key(model)
    path = cost_file.cost_path(key)
    path.parent.mkdir(parents=True)
    now = time.time()
    path.write_text(json.dumps({"key": key, "seconds": [0.01, 0.01, 0.015], "skinny_sizes": None, "measured_at": now}))
    assert cost_file.read_cost(path, key) is not None  # the same record with sane times is read
    for seconds in ([0.02, 0.01], [-1.0, 0.5], [0.01]):
        path.write_text(json.dumps({"key": key, "seconds": seconds, "skinny_sizes": None, "measured_at": now}))
        assert cost_file.read_cost(path, key) is None


def test_a_stored_curve_ages_and_one_from_the_future_is_not_used(cache):
    model = make_tiny_llama(seed=37)
    key = cost_file.cost_key(model)
    path = cost_file.cost_path(key)
    cost_file.write_cost(path, key, CURVE)
    written = json.loads(path.read_text())
    assert written["origin"] == cost_file.MEASURED and abs(written["measured_at"] - time.time()) < 60
    assert cost_file.read_cost(path, key) is not None
    assert cost_file.read_cost(path, key, now=written["measured_at"] + cost_file.MAX_AGE_S + 1) is None
    assert cost_file.read_cost(path, key, now=written["measured_at"] - 3600) is None  # a clock that went back
    del written["measured_at"]  # a record of an older format: when it was measured is unknown
    path.write_text(json.dumps(written))
    assert cost_file.read_cost(path, key) is None


def test_an_implausible_stored_curve_is_measured_again_not_used(cache):
    """A real user cache held 0.078 s for one and two new tokens and 0.905 s for 3 to 16 (11.6
    lone roots; a 4-token forward took 0.079 s): every later process planned lone roots."""
    model = make_tiny_llama(seed=38)
    key = cost_file.cost_key(model)
    path = cost_file.cost_path(key)
    spoiled = VerifyCost.from_points([1, 2, 3, 16, 32], [0.078, 0.078, 0.905, 0.905, 4.17])
    assert list(implausible_sizes(spoiled)[:3]) == [3, 4, 5] and not plausible(spoiled)
    cost_file.write_cost(path, key, spoiled)
    assert cost_file.read_cost(path, key) is None
    memory = PluginMemory()
    assert np.allclose(memory.cost(model).seconds, CURVE.seconds)  # measured afresh
    assert len(cache) == 1 and cost_file.read_cost(path, key) is not None  # and kept in its place


def test_an_implausible_measurement_is_used_within_the_plausible_limit_and_not_kept(cache, monkeypatch):
    model = make_tiny_llama(seed=39)
    busy = VerifyCost.from_points([1, 4, 64], [0.01, 0.2, 0.3])  # 4 tokens at 20 lone roots
    monkeypatch.setattr(cost_probe, "measure_cost", lambda model, probe=None: busy)
    used = PluginMemory().cost(model)
    assert plausible(used) and used.seconds[4] == pytest.approx(1.5 * 4 * 0.01)
    assert not cost_file.cost_path(cost_file.cost_key(model)).exists()


def test_another_model_shape_gets_its_own_curve(cache):
    small, wide = make_tiny_llama(seed=35), make_tiny_llama(seed=35, vocab_size=512)
    assert cost_file.cost_key(small) != cost_file.cost_key(wide)
    PluginMemory().cost(small)
    PluginMemory().cost(wide)
    assert len(cache) == 2


def test_a_file_for_another_key_is_foreign_and_ignored(cache):
    small, wide = make_tiny_llama(seed=36), make_tiny_llama(seed=36, vocab_size=512)
    PluginMemory().cost(small)
    small_path = cost_file.cost_path(cost_file.cost_key(small))
    wide_path = cost_file.cost_path(cost_file.cost_key(wide))
    wide_path.write_bytes(small_path.read_bytes())  # right place, someone else's curve
    assert cost_file.read_cost(wide_path, cost_file.cost_key(wide)) is None


def test_the_cache_directory_follows_xdg_without_the_override(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "retrieval-draft"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_the_machines_matmul_loop_is_kept_with_the_curve_and_decoding_runs_it(cache, monkeypatch):
    import torch

    import retrieval_draft
    from retrieval_draft.model.tree_model import TreeModel
    from tests.conftest import random_prompt

    model = make_tiny_llama(seed=36)
    key = cost_file.cost_key(model)
    walking = VerifyCost.from_points([1, 8, 64], [0.01, 0.02, 0.05], skinny_sizes=frozenset(range(1, 65)), row_by_row=True)
    cost_file.write_cost(cost_file.cost_path(key), key, walking)
    assert cost_file.read_cost(cost_file.cost_path(key), key).row_by_row is True
    loops = []
    real = TreeModel.score
    monkeypatch.setattr(TreeModel, "score", lambda self, packed: loops.append(self.row_by_row) or real(self, packed))
    prompt = random_prompt(1)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                         custom_generate=retrieval_draft.generate, draft_memory=PluginMemory())
    assert torch.equal(out, model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False))
    assert loops and all(loops) and not cache  # the stored choice, not measured again
    body = json.loads(cost_file.cost_path(key).read_text())
    body["row_by_row"] = "yes"
    cost_file.cost_path(key).write_text(json.dumps(body))
    assert cost_file.read_cost(cost_file.cost_path(key), key) is None  # a damaged record is not used


def test_an_editors_cache_warming_runs_the_stored_matmul_loop_and_measures_nothing(cache, monkeypatch):
    import torch

    import retrieval_draft
    from retrieval_draft.model.tree_model import TreeModel
    from tests.conftest import random_prompt

    model = make_tiny_llama(seed=37)
    key = cost_file.cost_key(model)
    walking = VerifyCost.from_points([1, 8, 64], [0.01, 0.02, 0.05], skinny_sizes=frozenset(range(1, 65)), row_by_row=True)
    cost_file.write_cost(cost_file.cost_path(key), key, walking)
    forwards = []  # (loop, rows x width through the kernel or None) of every forward the prefills run
    real = TreeModel._run
    monkeypatch.setattr(TreeModel, "_run", lambda self, *a, **k: forwards.append((self.row_by_row, k.get("size"))) or real(self, *a, **k))
    memory, prompt = PluginMemory(), random_prompt(1, length=30)
    retrieval_draft.prefill(model, prompt[:, :20], draft_memory=memory)
    stats = retrieval_draft.prefill(model, prompt, draft_memory=memory)
    assert stats.reused_tokens > 0 and any(size for _, size in forwards)  # the second read 10 new tokens through the kernel
    assert forwards and all(loop for loop, _ in forwards) and not cache  # the stored loop; no curve measured
    cost_file.cost_path(key).unlink()
    forwards.clear()
    retrieval_draft.prefill(make_tiny_llama(seed=38), prompt, draft_memory=PluginMemory())
    assert forwards and not any(loop for loop, _ in forwards) and not cache  # no curve anywhere: the blocked loop
