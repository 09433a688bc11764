"""tools.diagnostics.forward_kernels names what a tree forward runs beyond a lone root's (tiny model, CPU)."""

import json

from tools.diagnostics.forward_kernels import main


def test_a_tree_forward_adds_the_grouped_attention_copies_and_the_mask(tmp_path):
    out = tmp_path / "kernels.json"
    assert main(["--device", "cpu", "--dtype", "float32", "--shape", "tiny", "--sizes", "3", "--repeats", "1",
                 "--cache-len", "16", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    lone, tree = result["by_size"]["1"], result["by_size"]["3"]
    assert lone["wall_ms"] > 0 and tree["launches"] > lone["launches"] > 0
    extra = result["extra_over_lone_root"]["3"]
    # two layers: stacked queries and output copied per layer, the tiled mask once per forward
    assert extra["aten::copy_"] >= 2 * 2 and extra["aten::masked_fill_"] == 1
