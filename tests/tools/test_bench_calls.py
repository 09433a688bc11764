"""The benchmark calls ``generate`` as the README does, and builds its fresh-process commands (tiny model;
``test_bench_quick`` runs the fresh processes on SmolLM2)."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

import retrieval_draft
from tools.bench import run as bench
from tools.bench.fresh import first_call_command
from tools.bench.systems import SYSTEMS, ModelHandles, RunSetup, generate_kwargs, run_system

from tests.conftest import random_prompt

STORE = "some/store-dir"
OURS_EXTRAS = {"custom_generate", "datastore", "draft_tokenizer", "draft_stats"}


def setup_for(model, ids, datastore=STORE, tokenizer="the-tokenizer", reference=None) -> RunSetup:
    return RunSetup(model, ids, 8, {}, 0, reference, datastore, tokenizer, {}, None)


def test_default_system_passes_no_drafters_and_nothing_users_do_not_pass():
    ids = random_prompt(0)
    kwargs = generate_kwargs(SYSTEMS["defaults"], setup_for(None, ids), retrieval_draft.DecodeStats())
    assert kwargs["custom_generate"] is retrieval_draft.generate
    assert set(kwargs) == {"attention_mask", "max_new_tokens", "custom_generate", "draft_stats"}


def test_datastore_system_passes_the_path_string_and_the_tokenizer():
    kwargs = generate_kwargs(SYSTEMS["datastore"], setup_for(None, random_prompt(0)))
    assert kwargs["datastore"] == STORE and isinstance(kwargs["datastore"], str)
    assert kwargs["draft_tokenizer"] == "the-tokenizer"
    assert "drafters" not in kwargs and set(kwargs) - {"attention_mask", "max_new_tokens"} <= OURS_EXTRAS


def test_every_system_is_hf_readme_or_a_labelled_diagnostic():
    for system in SYSTEMS.values():
        if system.kind == "readme":
            assert system.drafters is None and "(README call)" in system.label
        elif system.kind == "diagnostic":
            assert (system.drafters or system.plugin_kwargs) and system.label.startswith("diagnostic:")
        elif system.kind == "peer":
            assert system.drafters is not None and system.label.startswith("peer:")
        else:
            assert system.kind == "hf" and system.label.startswith("HF")
    kwargs = generate_kwargs(SYSTEMS["hf"], setup_for(None, random_prompt(0)))
    assert kwargs["do_sample"] is False and "custom_generate" not in kwargs


def test_readme_defaults_call_equals_greedy_on_its_own_handle(tiny_llama):
    ids = random_prompt(3, repeat=3)
    handles = ModelHandles(tiny_llama)
    handle = handles.get(SYSTEMS["defaults"], "grounded", 0)
    assert handle is not tiny_llama and handle.model is tiny_llama.model  # weights shared
    assert handles.get(SYSTEMS["defaults"], "grounded", 0) is handle
    assert handles.get(SYSTEMS["defaults"], "grounded", 1) is not handle
    assert handles.get(SYSTEMS["prompt"], "grounded", 0) is not handle
    assert handles.get(SYSTEMS["hf"], "grounded", 0) is tiny_llama
    reference = run_system(SYSTEMS["hf"], setup_for(tiny_llama, ids, None)).output
    ours = run_system(SYSTEMS["defaults"], setup_for(handle, ids, None))
    assert torch.equal(ours.output, reference) and ours.stats.steps > 0


def test_the_run_records_the_cost_curve_and_corrections_each_handle_planned_with(tiny_llama):
    from retrieval_draft.sessions.memory import PROCESS_MEMORY
    from retrieval_draft.planning.calibration import PROB_EDGES
    from retrieval_draft.planning.cost import VerifyCost

    handles = ModelHandles(tiny_llama)
    handle = handles.get(SYSTEMS["defaults"], "chat", 0)
    handles.get(SYSTEMS["budget0"], "chat", 0)  # a handle that never generates is not reported
    # 10 us plus 1 us per extra token: cheaper than any real forward, so the curve stays the one
    # planned with (a machine proved faster than its curve would have it replaced at the call's end)
    PROCESS_MEMORY.model(handle).cost = VerifyCost.from_points([1, 65], [10e-6, 74e-6])
    run_system(SYSTEMS["defaults"], setup_for(handle, random_prompt(3, repeat=3), None))
    planning = handles.planning()
    assert list(planning) == ["defaults/chat/0"]
    state = planning["defaults/chat/0"]
    assert state["curve_ms"] == {"1": 0.01, "2": 0.011, "3": 0.012, "4": 0.013, "8": 0.017, "16": 0.025,
                                 "32": 0.041}
    assert state["observed_bands"] == [1, 2, 4, 8, 16, 32] and sum(state["observed_count"]) > 0
    seen = [ratio for ratio, count in zip(state["observed_ratio"], state["observed_count"]) if count]
    assert all(ratio > 1 for ratio in seen)  # every observed band ran slower than that curve
    rates = state["first_token_rates"]
    assert rates and all(len(bucket_rates) == len(PROB_EDGES) - 1 for bucket_rates in rates.values())
    assert all(0 <= rate <= 1 for bucket_rates in rates.values() for rate in bucket_rates)


def test_parse_args_quick_skips_the_fresh_process_and_full_measures_it(tmp_path):
    quick = bench.parse_args(["--quick", "--systems", "oracle,defaults"])
    assert quick.fresh_process is False and quick.systems == ["hf", "defaults", "oracle"]
    assert bench.parse_args([]).fresh_process is True
    assert bench.parse_args(["--quick", "--fresh-process"]).fresh_process is True
    with pytest.raises(SystemExit):
        bench.parse_args(["--quick", "--datastore", str(tmp_path / "missing")])


def test_first_call_command_passes_the_datastore_to_ours_only():
    args = argparse.Namespace(max_new_tokens=8, model=None, threads=2, sampling=False, temperature=0.7, seed=0)
    ours, plain = first_call_command("ours", args, STORE), first_call_command("hf", args, STORE)
    assert ours[:3] == [sys.executable, "-m", "tools.bench.first_call"]
    assert ours[ours.index("--datastore") + 1] == STORE and "--datastore" not in plain


def test_the_no_recycle_diagnostic_is_the_defaults_less_recycling_and_stays_identical(tiny_llama):
    ids = random_prompt(4, repeat=2)
    handle = ModelHandles(tiny_llama).get(SYSTEMS["no_recycle"], "chat", 0)
    setup = setup_for(handle, ids, None)
    assert [d.name for d in SYSTEMS["no_recycle"].drafters(setup)] == ["prompt", "history"]
    reference = run_system(SYSTEMS["hf"], setup_for(tiny_llama, ids, None)).output
    assert torch.equal(run_system(SYSTEMS["no_recycle"], setup).output, reference)


def test_text_workloads_build_chat_prompts_and_multiturn_encodes_every_turn():
    from tools.bench.workloads import TEXT_WORKLOADS, build_workloads

    workloads = build_workloads(list(TEXT_WORKLOADS), 5, seed=0)
    assert all(len(prompts) == 5 and all(p.chat and p.text for p in prompts) for prompts in workloads.values())
    turn = workloads["multiturn"][0]

    class Template:
        def apply_chat_template(self, messages, add_generation_prompt, return_dict):
            assert add_generation_prompt and not return_dict
            return [len(m["content"]) for m in messages]

    session = argparse.Namespace(tokenizer=Template())
    ids = bench.encode(session, turn)
    assert ids.tolist() == [[len(turn.turns[0][1]), len(turn.turns[1][1]), len(turn.text)]]


def test_the_budget0_system_is_the_readme_call_with_no_tree():
    kwargs = generate_kwargs(SYSTEMS["budget0"], setup_for(None, random_prompt(0)))
    assert kwargs["tree_budget"] == 0 and kwargs["custom_generate"] is retrieval_draft.generate
    assert "drafters" not in kwargs and "datastore" not in kwargs


def test_saved_prompts_are_read_back_unchanged_and_a_missing_workload_is_named(tmp_path):
    from tools.bench.workloads import build_workloads, read_prompts, save_prompts

    built = build_workloads(["chat", "multiturn"], 2, 0)
    path = tmp_path / "prompts.json"
    save_prompts(path, built)
    assert read_prompts(path, ["multiturn", "chat"], 2) == {"multiturn": built["multiturn"], "chat": built["chat"]}
    assert read_prompts(path, ["chat"], 1) == {"chat": built["chat"][:1]}
    assert built["multiturn"][0].turns  # the earlier turns survive the round trip as tuples
    with pytest.raises(ValueError, match="no prompts of qa"):
        read_prompts(path, ["chat", "qa"], 2)


def test_a_gpu_run_leaves_out_the_fresh_processes_and_saved_prompts_must_exist(tmp_path):
    if torch.cuda.is_available():
        args = bench.parse_args(["--device", "cuda", "--dtype", "bfloat16"])
        assert (args.device, args.dtype, args.fresh_process) == ("cuda", "bfloat16", False)
    else:
        with pytest.raises(SystemExit):  # refused before the model loads
            bench.parse_args(["--device", "cuda"])
    assert bench.parse_args(["--device", "meta"]).fresh_process is False  # any device but the CPU
    for argv in (["--device", "cuda", "--fresh-process"], ["--prompts-from", str(tmp_path / "missing.json")],
                 ["--device", "gpu0"],
                 ["--save-prompts", "a.json", "--prompts-from", "b.json"], ["--dtype", "int8"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)


def test_a_parted_output_is_exact_only_at_a_near_tie_of_plain_greedys_logits():
    from tests.conftest import make_tiny_llama
    from tools.bench.exactness import near_tie_verdicts

    model = make_tiny_llama().to(torch.bfloat16)
    ids = random_prompt(1)
    plain = {"max_new_tokens": 6, "do_sample": False}
    reference = model.generate(ids, **plain)
    with torch.inference_mode():
        logits = torch.stack(model.generate(ids, **plain, output_logits=True, return_dict_in_generate=True).logits)
    start = ids.shape[1]
    ranked = logits[:, 0].float().argsort(dim=-1, descending=True)
    gaps = logits[:, 0].float().gather(1, ranked[:, :2])
    tied = int((gaps[:, 0] - gaps[:, 1]).argmin())  # plain's closest call, and a far-from-tied step
    second_best = reference.clone()
    second_best[0, start + tied] = ranked[tied, 1]
    worst = reference.clone()
    worst[0, start] = ranked[0, -1]
    same, near, far = near_tie_verdicts(model, ids, reference, [reference, second_best, worst], plain)
    assert same == {"exact": True, "first_difference": None, "gap": None, "tolerance": None}
    assert far["exact"] is False and far["first_difference"] == 0 and far["gap"] > far["tolerance"]
    assert near["first_difference"] == tied
    assert near["exact"] == (near["gap"] <= near["tolerance"])  # the rule, whichever side this step falls


def test_the_static_systems_and_hfs_static_cache_run_and_the_share_of_static_is_over_static_without_drafts(tiny_llama):
    from tools.bench.report import per_prompt

    ids = random_prompt(4, repeat=3)
    handles = ModelHandles(tiny_llama)
    reference = run_system(SYSTEMS["hf"], setup_for(tiny_llama, ids, None)).output
    runs = []
    for name in ("hf", "hf_compiled", "static", "static_budget0", "budget0"):
        kwargs = generate_kwargs(SYSTEMS[name], setup_for(None, ids, None))
        assert kwargs.get("cache_implementation") == ("static" if "static" in name or name == "hf_compiled" else None)
        result = run_system(SYSTEMS[name], setup_for(handles.get(SYSTEMS[name], "chat", 0), ids, None))
        assert torch.equal(result.output, reference), name
        runs.append({"workload": "chat", "prompt_id": "p", "system": name, "tokens_per_s": 10.0 * (len(runs) + 1),
                     "wall_s": 1.0, "new_tokens": 8, "stats": None if name.startswith("hf") else {}})
    rows = {row["system"]: row for row in per_prompt(runs)}
    assert rows["static"]["share"] == 30.0 / 40.0  # over static_budget0, not budget0 (50)
    assert rows["static"]["over_compiled"] == 30.0 / 20.0  # over HF's static cache
