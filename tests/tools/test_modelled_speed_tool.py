"""tools.bench.modelled_speed: forwards priced by a fixed table, so the planner's choices do not follow the clock."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from retrieval_draft.planning.planner import TreePlanner
from tests.conftest import random_prompt
from tools.bench.gpu_projection import run_system
from tools.bench.modelled_speed import ForwardTable, TablePlanner, hf_modelled_s, read_table

TABLE = ForwardTable(sizes=np.array([1, 2, 4, 8]), contexts=np.array([100, 1100]),
                     seconds=np.array([[0.050, 0.052, 0.056, 0.064], [0.060, 0.066, 0.074, 0.090]]))


def test_the_table_is_linear_in_size_and_cache_length_and_extrapolates_along_the_last_slope():
    assert TABLE.at(4, 100) == pytest.approx(0.056)
    assert TABLE.at(3, 100) == pytest.approx(0.054)  # between timed sizes
    assert TABLE.at(2, 600) == pytest.approx((0.052 + 0.066) / 2)  # halfway between the cache lengths
    assert TABLE.at(1, 2100) == pytest.approx(0.070)  # past the longer length
    assert TABLE.at(16, 100) == pytest.approx(0.064 + 8 * 0.002)  # past the largest size, along its slope


def test_the_planner_is_told_the_tables_time_whatever_the_clock_says():
    ranked = [np.linspace(0.8, 0.1, 8)]
    planners = {"table, slow clock": TablePlanner(TABLE), "table, table's time": TablePlanner(TABLE),
                "clock": TreePlanner(cost=TablePlanner(TABLE).cost)}
    for _ in range(20):
        planners["table, slow clock"].observe_forward(1, 4, 5.0, cache_len=900)
        planners["table, table's time"].observe_forward(1, 4, TABLE.at(4, 900), cache_len=900)
        planners["clock"].observe_forward(1, 4, 5.0, cache_len=900)
    widths = {name: planner.width(ranked, cache_len=900) for name, planner in planners.items()}
    assert widths["table, slow clock"] == widths["table, table's time"]
    assert widths["clock"] < widths["table, slow clock"]  # the clock's 5 s forwards would have shrunk the trees
    assert planners["table, slow clock"].modelled_s == pytest.approx(20 * TABLE.at(4, 900))


def test_plain_greedy_is_priced_one_token_forward_per_new_token_plus_its_host_time():
    prompt, out = torch.zeros((1, 100), dtype=torch.long), torch.zeros((1, 103), dtype=torch.long)
    expected = sum(TABLE.at(1, length) for length in (100, 101, 102)) + 3 * 0.0005
    assert hf_modelled_s(TABLE, [prompt], [out], host_ms=0.5) == pytest.approx(expected)


def test_a_table_planned_run_is_identical_to_greedy_and_adds_up_its_forwards(tiny_llama):
    prompts = [random_prompt(1, repeat=3)]
    plain = tiny_llama.generate(prompts[0], attention_mask=torch.ones_like(prompts[0]), max_new_tokens=16,
                                do_sample=False)
    planner = TablePlanner(TABLE)
    row = run_system(copy.copy(tiny_llama), prompts, 16, None, planner)
    assert torch.equal(row["outputs"][0], plain)
    assert row["forwards"] >= 1
    assert planner.modelled_s >= row["forwards"] * TABLE.at(1, 0)  # every forward priced, none below a lone root


def test_a_table_is_read_back_from_an_earlier_runs_json(tmp_path):
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps({"table": {"sizes": TABLE.sizes.tolist(), "contexts": TABLE.contexts.tolist(),
                                          "seconds": TABLE.seconds.tolist()}}))
    again = read_table(path)
    assert again.at(3, 600) == pytest.approx(TABLE.at(3, 600))
