"""tools.diagnostics.step_profile: a step's phases add up, and replaying a prompt shows per-token work."""

from __future__ import annotations

import torch

from tools.diagnostics.step_profile import PHASES, markdown, profile

from tests.conftest import make_tiny_llama, random_prompt


def test_the_phases_of_a_step_add_up_and_a_replayed_prompt_takes_more_tokens_per_step():
    model = make_tiny_llama(seed=21)
    batches = [random_prompt(seed) for seed in (1, 2, 3)]
    table = profile(model, "tiny", batches, max_new_tokens=24, replay=True)
    fresh, replayed = table["tiny fresh"], table["tiny replayed"]
    for row in (fresh, replayed):
        assert row["forwards"] > 0 and row["tokens_per_step"] >= 1
        assert abs(sum(row[phase] for phase in PHASES) - row["step"]) < 0.01
        assert abs(row["host"] + row["forward"] - row["step"]) < 0.01
        assert row["forward"] > 0 and row["hf_host_per_token"] > 0
    # the second pass over the same prompts drafts their whole answers from the output history
    assert replayed["tokens_per_step"] > 2 * fresh["tokens_per_step"]
    assert "| tiny replayed |" in markdown(table)


def test_a_batch_counts_one_step_per_forward():
    model = make_tiny_llama(seed=22)
    batches = [torch.cat([random_prompt(seed), random_prompt(seed + 10)]) for seed in (1, 2)]
    row = profile(model, "batch", batches, max_new_tokens=12, replay=False)["batch fresh"]
    assert row["tokens_per_step"] >= 2  # two rows advance together, at least one token each


def test_the_held_out_host_time_is_the_step_less_a_plain_forward_over_its_nodes():
    model = make_tiny_llama(seed=23)
    batches = [random_prompt(seed) for seed in (1, 2)]
    for extra in ({}, {"cache_implementation": "static"}):
        row = profile(model, "one", batches, max_new_tokens=16, replay=False, **extra)["one fresh"]
        assert row["plain_forward"] > 0
        assert abs(row["beyond_plain"] - max(row["step"] - row["plain_forward"], 0.0)) < 0.002
        kept = (8 + row["hf_host_per_token"]) / (8 + row["beyond_plain"])
        assert abs(row["kept_8ms"] - kept) < 0.002
    batched = profile(model, "two", [torch.cat([b, b]) for b in batches], max_new_tokens=8, replay=False)["two fresh"]
    assert "beyond_plain" not in batched  # per row: B = 1 only


def test_the_command_line_profiles_the_static_path_beside_the_default(tmp_path, capsys):
    import json

    from tools.diagnostics.step_profile import main

    out = tmp_path / "steps.json"
    assert main(["--models", "tiny", "--batches", "1", "--prompts", "1", "--max-new-tokens", "8", "--static",
                 "--json", str(out)]) == 0
    table = json.loads(out.read_text())["ms_per_step"]
    assert {"tiny B=1 fresh", "tiny B=1 static fresh"} <= set(table)
    assert all("beyond_plain" in row for row in table.values())
    assert "| tiny B=1 static replayed |" in capsys.readouterr().out


def test_the_tiny_models_vocabulary_is_the_command_lines(tmp_path, monkeypatch):
    """``--tiny-vocab``: the tiny model and its random prompts both take the vocabulary given;
    ``--cache fresh``: the run plans from a cache with no curve for it."""
    import json

    from tools.diagnostics import step_profile

    seen = []
    real_profile = step_profile.profile

    def spy(model, label, batches, *args, **kwargs):
        seen.append((model.config.vocab_size, max(int(b.max()) for b in batches)))
        return real_profile(model, label, batches, *args, **kwargs)

    monkeypatch.setattr(step_profile, "profile", spy)
    out = tmp_path / "steps.json"
    assert step_profile.main(["--models", "tiny", "--batches", "1", "--prompts", "1", "--max-new-tokens", "8",
                              "--tiny-vocab", "4096", "--cache", "fresh", "--json", str(out)]) == 0
    assert seen and all(vocab == 4096 and top < 4096 for vocab, top in seen)
    payload = json.loads(out.read_text())
    assert payload["tiny_vocab"] == 4096
    assert payload["cache"]["tiny"]["mode"] == "fresh" and payload["cache"]["tiny"]["curve"] is None  # nothing kept


def test_a_curve_measurement_left_open_by_the_warm_up_is_finished_before_the_timed_passes(monkeypatch):
    """After the two warm-up calls, while the plugin memory still has a cost-curve measurement open
    (a re-measurement the warm-up's forwards asked for), one more untimed call runs."""
    from tools.diagnostics import step_profile

    model = make_tiny_llama(seed=24)
    batches = [random_prompt(seed) for seed in (1, 2)]
    real_ours, calls = step_profile.ours, []

    def ours(model, batches, max_new_tokens, memory, **extra):
        held = memory.model(model)
        calls.append(held.probe)
        if held.probe == "open":  # stands for a measurement's pending probe forwards
            held.probe = None  # the call ran them
            return {}
        row = real_ours(model, batches, max_new_tokens, memory, **extra)
        if len(calls) == 2:
            held.probe = "open"  # as if the second warm-up's forwards drifted from the curve
        return row

    monkeypatch.setattr(step_profile, "ours", ours)
    table = step_profile.profile(model, "one", batches, max_new_tokens=8, replay=True)
    assert calls[2] == "open" and len(calls) == 5  # two warm-ups, the third, then fresh and replayed
    assert calls[3] is None and {"one fresh", "one replayed"} <= set(table)
