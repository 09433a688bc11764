"""The forward-cost curve is kept on disk per model shape and machine; bad files are re-measured."""

from __future__ import annotations

import json

import numpy as np
import pytest

import retrieval_draft.planning.cost_file as cost_file
import retrieval_draft.planning.cost_probe as cost_probe
from retrieval_draft.cache_dir import CACHE_ENV, cache_root
from retrieval_draft.memory import PluginMemory
from retrieval_draft.planning.cost import VerifyCost
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
    for seconds in ([0.02, 0.01], [-1.0, 0.5], [0.01]):
        path.write_text(json.dumps({"key": key, "seconds": seconds, "skinny_sizes": None}))
        assert cost_file.read_cost(path, key) is None


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
