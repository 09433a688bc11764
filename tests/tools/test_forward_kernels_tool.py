"""tools.diagnostics.forward_kernels names what a tree forward runs beyond a lone root's (tiny model, CPU)."""

import json
from collections import Counter
from types import SimpleNamespace

import tools.diagnostics.forward_kernels as forward_kernels
from retrieval_draft.planning import cost_probe
from tools.diagnostics.forward_kernels import device_ms_by_name, main

from tests.stand_in_clocks import FixedTimer, stepping_clock


def test_a_tree_forward_adds_the_grouped_attention_copies_and_the_mask(tmp_path, monkeypatch):
    monkeypatch.setattr(forward_kernels, "time", stepping_clock(0.25))  # each timed forward: 250 ms by this clock
    monkeypatch.setattr(cost_probe, "ForwardTimer", FixedTimer)  # the probe's chains: 125 ms each
    out = tmp_path / "kernels.json"
    assert main(["--device", "cpu", "--dtype", "float32", "--shape", "tiny", "--sizes", "3", "--repeats", "1",
                 "--cache-len", "40", "--decode-tokens", "12", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    lone, tree = result["by_size"]["1"], result["by_size"]["3"]
    assert lone["wall_ms"] == tree["wall_ms"] == 250.0 and tree["launches"] > lone["launches"] > 0
    assert lone["probe_chain_ms"] == tree["probe_chain_ms"] == 125.0  # the cost probe's timing beside the wall's
    decoding = result["in_decoding"]
    assert set(decoding) == {"1", "3"} and decoding["1"]["nodes_per_step"] == 1.0
    # fixed trees of up to 3 nodes, filled by drafts of the repeated block: more than one node on average
    assert 1.0 < decoding["3"]["nodes_per_step"] <= 3.0
    assert all(row["step_ms"] >= row["device_forward_ms"] > 0 for row in decoding.values())
    extra = result["extra_over_lone_root"]["3"]
    # two layers: stacked queries and output copied per layer, the tiled mask once per forward
    assert extra["aten::copy_"] >= 2 * 2 and extra["aten::masked_fill_"] == 1


def test_device_times_are_read_by_the_averages_key_in_milliseconds():
    # torch's FunctionEventAvg has ``key``, not ``name`` (the first GPU run of this tool failed on it)
    averages = [SimpleNamespace(key="gemm", self_device_time_total=1500.0),
                SimpleNamespace(key="not launched", self_device_time_total=9.0)]
    assert device_ms_by_name(averages, Counter({"gemm": 3})) == {"gemm": 1.5}
