"""tools.gpu_check runs on CPU in seconds, and neither it nor the runtime needs datrie or gguf to import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from retrieval_draft.planning import cost_probe
from tools.gpu_check import main

from tests.stand_in_clocks import FixedTimer


def test_a_quick_cpu_run_holds_the_exactness_rule_and_writes_a_cost_curve(tmp_path, monkeypatch):
    """float32 identical; bfloat16 identical or first parted at a near-tie (any CPU rounds its own way);
    the curve is written in ms of the timer it reads (a stand-in: every forward 125 ms)."""
    monkeypatch.setattr(cost_probe, "ForwardTimer", FixedTimer)
    code = main(["--device", "cpu", "--quick", "--archs", "llama,gemma3,mistral", "--out", str(tmp_path)])
    equality = json.loads((tmp_path / "equality.json").read_text())
    cost = json.loads((tmp_path / "cost.json").read_text())
    assert code == 0 and equality["device"].startswith("cpu")
    runs = {(model, dtype): r for model, by in equality["results"].items() for dtype, r in by.items() if dtype != "skipped"}
    assert set(runs) == {(m, d) for m in ("llama", "gemma3", "mistral") for d in ("float32", "bfloat16")}
    assert all(run["exact"] and run["device"] == "cpu" and run["steps"] > 0 for r in runs.values() for run in r)
    assert all(run["identical"] for (_, dtype), r in runs.items() if dtype == "float32" for run in r)
    for run in (run for r in runs.values() for run in r if not run["identical"]):
        assert run["gap_at_difference"] <= run["near_tie_tolerance"]
    curve = cost["ms_by_new_tokens"]["tiny_llama/float32"]
    assert curve == {"1": 125.0, "2": 125.0, "4": 125.0, "8": 125.0}
    static = json.loads((tmp_path / "static.json").read_text())["results"]
    assert set(static) == {"llama", "real_model"} and "skipped" in static["real_model"]
    for dtype, checks in static["llama"].items():
        assert [check["batch"] for check in checks] == [1, 2]
        assert all(call["exact"] and (call["identical"] or dtype != "float32")
                   for check in checks for call in check["ours"])
        assert all(len(check["hf_static_s"]) == 2 for check in checks)


@pytest.fixture(scope="module")
def probe() -> list[str]:
    """One new process (a third of this module's time is a process's imports): it imports the tool
    and the runtime and prints which of datrie and gguf that loaded; then, with both made
    unimportable, runs a default plugin call on a tiny model and prints whether it equals plain
    greedy (the GPU machines have no datrie: the plugin without ``datastore=`` must not need it)."""
    code = (
        "import sys, tools.gpu_check, tools.bench.run, retrieval_draft, retrieval_draft.model.tree_model\n"
        "import retrieval_draft.planning.cost, retrieval_draft.sessions.session\n"
        "print(sorted(m for m in ('datrie', 'gguf') if m in sys.modules))\n"
        "sys.modules['datrie'] = None; sys.modules['gguf'] = None\n"
        "import torch\n"
        "from tools.gpu_check import TINY\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "torch.manual_seed(0); model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()\n"
        "ids = torch.randint(3, 320, (1, 12))\n"
        "ours = model.generate(ids, max_new_tokens=8, do_sample=False, custom_generate=retrieval_draft.generate)\n"
        "plain = model.generate(ids, max_new_tokens=8, do_sample=False)\n"
        "print(bool(torch.equal(ours, plain)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()


def test_the_tool_and_the_runtime_import_without_datrie_or_gguf(probe):
    assert probe[0] == "[]"


def test_a_default_plugin_call_runs_where_datrie_cannot_be_imported(probe):
    assert probe[-1] == "True"
