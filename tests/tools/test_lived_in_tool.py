"""``python -m tools.bench.lived_in``: the planted caches are the ones its report names, and the
verdict compares each condition with the fresh cache on the same calls."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retrieval_draft.planning.cost import VerifyCost, plausible
from retrieval_draft.planning.cost_file import read_record
from tools.bench.lived_in import DEAR_FACTOR, main, plant, summary


def stored_cache(root):
    (root / "cost-curves").mkdir(parents=True)
    (root / "learned-rates").mkdir()
    curve = VerifyCost.from_points([1, 2, 4, 8, 16, 32], [0.05, 0.052, 0.055, 0.06, 0.07, 0.09])
    (root / "cost-curves" / "c.json").write_text(json.dumps(
        {"key": {"device": "cpu:x"}, "seconds": curve.seconds.tolist(), "skinny_sizes": None, "measured_at": 1.0}))
    counts = {"prior_scale": 0.5, "hits": [[1.0, 2.0]], "trials": [[2.0, 4.0]]}
    (root / "learned-rates" / "r.json").write_text(json.dumps({"format": 1, "greedy": {"prompt": counts}, "sampling": {}}))
    return curve


@pytest.mark.parametrize("condition", ["curve", "curve-across"])
def test_the_spoiled_curve_is_twelve_times_dearer_from_three_tokens_on(tmp_path, condition):
    curve = stored_cache(tmp_path)
    plant(tmp_path, condition)
    seconds = read_record(tmp_path / "cost-curves" / "c.json")["seconds"]
    assert np.allclose(seconds[:3], curve.seconds[:3]) and np.allclose(seconds[3:], DEAR_FACTOR * curve.seconds[3:])
    assert not plausible(VerifyCost(seconds))


def test_the_plausible_dear_curve_stays_inside_the_plausible_limit(tmp_path):
    curve = stored_cache(tmp_path)
    plant(tmp_path, "curve-plausible")
    seconds = read_record(tmp_path / "cost-curves" / "c.json")["seconds"]
    assert plausible(VerifyCost(seconds)) and seconds[16] > 10 * curve.seconds[16]


def test_planted_rates_say_no_draft_is_ever_accepted(tmp_path):
    stored_cache(tmp_path)
    plant(tmp_path, "rates-across")
    counts = json.loads((tmp_path / "learned-rates" / "r.json").read_text())["greedy"]["prompt"]
    assert counts["hits"] == [[0.0, 0.0]] and counts["trials"] == [[1e6, 1e6]]


@pytest.mark.parametrize("condition", ["rates-sure", "rates-sure-across"])
def test_planted_sure_rates_say_every_draft_is_accepted(tmp_path, condition):
    stored_cache(tmp_path)
    plant(tmp_path, condition)
    counts = json.loads((tmp_path / "learned-rates" / "r.json").read_text())["greedy"]["prompt"]
    assert counts["hits"] == [[1e6, 1e6]] and counts["trials"] == [[1e6, 1e6]]


def record(speedup: float) -> dict:
    return {"speedup": speedup, "share": speedup / 1.5, "budget0_speedup": 1.5, "nodes_per_step": 4.0, "identical": True}


def test_recovered_compares_the_last_half_of_the_calls_with_the_fresh_cache():
    rows = summary({
        "fresh": [record(1.0), record(2.0), record(2.0), record(2.0)],
        "curve": [record(0.5), record(0.5), record(1.9), record(1.9)],  # slow at first, then 95% of fresh
        "rates": [record(2.0), record(2.0), record(1.0), record(2.0)],  # 71% of fresh over the last half
    })
    verdict = {row["condition"]: (row["of_fresh"], row["recovered"]) for row in rows}
    assert verdict["fresh"] == (1.0, True)
    assert verdict["curve"] == (pytest.approx(0.95), True)
    assert verdict["rates"][1] is False and verdict["rates"][0] == pytest.approx(np.sqrt(0.5), abs=1e-3)


def test_an_unknown_condition_is_refused_before_any_model_loads():
    with pytest.raises(SystemExit, match="unknown conditions"):
        main(["--conditions", "fresh,stale"])


def test_a_fresh_bench_cache_holds_no_planning_records_links_the_kept_models_and_goes_afterwards(tmp_path, monkeypatch):
    from retrieval_draft.cache_dir import CACHE_ENV, cache_root
    from retrieval_draft.planning.cost_file import cost_key, cost_path, write_cost
    from tests.conftest import make_tiny_llama
    from tools.bench.cache_state import describe, fresh_cache, planning_records

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "user"))
    (tmp_path / "user" / "gguf-converted").mkdir(parents=True)
    model = make_tiny_llama(seed=61)
    write_cost(cost_path(cost_key(model)), cost_key(model), VerifyCost.from_points([1, 64], [0.01, 0.02]))
    lived = planning_records(model, "user")
    assert lived["curve"]["used"] and lived["curve"]["origin"] == "measured" and lived["curve"]["age_h"] < 1
    assert describe(lived).startswith("user cache: lived-in") and "used" in describe(lived)
    (tmp_path / "user" / "gguf-converted" / "kept.bin").write_bytes(b"a conversion")
    with fresh_cache() as fresh:
        assert cache_root() == fresh and (fresh / "gguf-converted").is_symlink()
        state = planning_records(model, "fresh")
        assert state["curve"] is None and not state["rates_stored"] and describe(state).startswith("user cache: fresh")
    assert not fresh.exists() and cache_root() == tmp_path / "user"  # its folder goes, the setting comes back
    assert (tmp_path / "user" / "gguf-converted" / "kept.bin").read_bytes() == b"a conversion"  # links, not targets
