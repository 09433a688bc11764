"""tools.diagnostics.step_profile: the step splits into parts that add up, and only tree forwards are profiled."""

from __future__ import annotations

from tools.diagnostics.step_profile import markdown, profile_prompts

from .conftest import make_tiny_llama, random_prompt


def test_the_parts_of_a_step_add_up():
    model = make_tiny_llama(seed=21)
    row = profile_prompts(model, [random_prompt(1, repeat=3), random_prompt(2)], max_new_tokens=24)
    assert row["steps"] > 0 and row["mean_tree_nodes"] >= 1
    assert 0 < row["matmul"] < row["forward"] and 0 < row["attention"] < row["forward"]
    assert abs(row["matmul"] + row["attention"] + row["forward_rest"] - row["forward"]) < 0.05
    assert abs(row["forward"] + row["outside_forward"] - row["step"]) < 0.05
    assert row["outside_forward"] > 0
    # 2 layers x 7 projections + lm_head per tree forward; the prompts' prefill would add more
    assert row["matmuls_per_step"] == 15
    assert "| tiny |" in markdown({"tiny": row})
