"""``retrieval-draft cache`` shows what the user cache holds for planning and resets it in one command."""

from __future__ import annotations

import time

import numpy as np
import pytest

from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.planning.cost import VerifyCost
from retrieval_draft.planning.cost_file import cost_key, cost_path, write_cost
from retrieval_draft.planning.rates_file import rates_path
from retrieval_draft.sessions.memory import PluginMemory
from retrieval_draft_datastore.cli import main
from tests.conftest import make_tiny_llama

SANE = VerifyCost.from_points([1, 2, 4, 8, 16, 32], [0.05, 0.052, 0.055, 0.06, 0.07, 0.09],
                              skinny_sizes=frozenset(range(1, 9)), row_by_row=True)
SPOILED = VerifyCost.from_points([1, 2, 3, 16, 32], [0.078, 0.078, 0.905, 0.905, 4.17])


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_report_names_a_spoiled_curve_as_not_used_and_a_sane_one_with_its_plans(cache, capsys):
    sane, spoiled = make_tiny_llama(seed=51), make_tiny_llama(seed=51, vocab_size=400)
    write_cost(cost_path(cost_key(sane)), cost_key(sane), SANE)
    write_cost(cost_path(cost_key(spoiled)), cost_key(spoiled), SPOILED)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    blocks = {block.split(":")[0].split()[-1]: block for block in out.split("\n\n")}
    sane_block = blocks[cost_path(cost_key(sane)).name]
    spoiled_block = blocks[cost_path(cost_key(spoiled)).name]
    assert "; used" in sane_block and "plausible: yes" in sane_block
    assert "NOT used" in spoiled_block and "plausible: no, too dear at 3-" in spoiled_block
    assert "in lone roots 2: 1.00, 4: 11.60" in spoiled_block
    assert "matmul kernel at sizes: 1-8, walking the weights row by row for few rows" in sane_block
    assert "matmul kernel at sizes: none\n" in spoiled_block
    planned = [int(part.split()[0]) for part in sane_block.split("would verify: ")[1].split(", ")]
    assert planned[0] <= planned[1] <= planned[2] and planned[2] > 0  # better chains, bigger trees


def test_reset_forgets_every_curve_and_rates_file_and_the_next_call_starts_afresh(cache, capsys):
    model = make_tiny_llama(seed=52)
    write_cost(cost_path(cost_key(model)), cost_key(model), SPOILED)
    memory = PluginMemory()
    memory.model(model)
    memory.save_learned(model, force=True)
    assert cost_path(cost_key(model)).exists() and rates_path(model).exists()
    assert main(["cache", "--reset"]) == 0
    assert "removed 2 file(s)" in capsys.readouterr().out
    assert not cost_path(cost_key(model)).exists() and not rates_path(model).exists()
    assert main(["cache"]) == 0
    assert "nothing stored" in capsys.readouterr().out


def test_model_limits_the_report_and_the_reset_to_that_models_files(cache, tmp_path, capsys):
    mine, other = make_tiny_llama(seed=53), make_tiny_llama(seed=53, vocab_size=400)
    folder = tmp_path / "tiny"
    mine.save_pretrained(folder)
    for model in (mine, other):
        write_cost(cost_path(cost_key(model)), cost_key(model), SANE)
    assert main(["cache", "--model", str(folder)]) == 0
    out = capsys.readouterr().out
    assert cost_path(cost_key(mine)).name in out and cost_path(cost_key(other)).name not in out
    assert main(["cache", "--model", str(folder), "--reset"]) == 0
    assert not cost_path(cost_key(mine)).exists() and cost_path(cost_key(other)).exists()


def test_an_old_curve_is_reported_as_measured_again(cache, capsys, monkeypatch):
    model = make_tiny_llama(seed=54)
    write_cost(cost_path(cost_key(model)), cost_key(model), SANE)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 8 * 24 * 3600)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "NOT used" in out and "plausible: yes" in out and np.isfinite(float(out.split(" h ago")[0].split()[-1]))


def test_learned_rates_are_shown_per_drafter_and_a_drafter_never_graded_says_so(cache, capsys):
    from retrieval_draft.planning.calibration import AcceptanceCalibrator
    from retrieval_draft.planning.rates_file import write_rates

    model = make_tiny_llama(seed=5)
    graded, idle = AcceptanceCalibrator(), AcceptanceCalibrator()
    graded.record(np.array([0.9, 0.9, 0.9, 0.9]), np.zeros(4, dtype=np.int64), np.array([True, True, True, False]))
    write_rates(rates_path(model), {False: {"prompt": graded, "recycle": idle}, True: {}})
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "prompt: 0.75 of 4 graded draft tokens accepted (greedy)" in out
    assert "recycle: no draft tokens graded yet (greedy)" in out and "nan" not in out
