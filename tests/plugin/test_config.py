"""Nonsense drafting settings are refused with a typed error before any model work."""

from __future__ import annotations

import pytest
import torch

import retrieval_draft
from retrieval_draft.config import DEFAULTS, DraftConfig
from retrieval_draft.errors import InvalidInputError
from tests.conftest import make_tiny_llama, random_prompt


@pytest.mark.parametrize("option, value", [("tree_budget", -1), ("max_draft_len", 0), ("tree_budget", 2.5)])
def test_a_nonsense_setting_is_refused_by_name_before_any_forward(option, value):
    model = make_tiny_llama(seed=91)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    prompt = random_prompt(91)
    with pytest.raises(InvalidInputError, match=option):
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                       custom_generate=retrieval_draft.generate, **{option: value})
    assert forwards == []


def test_the_plugin_signature_takes_its_defaults_from_the_one_config():
    import inspect

    params = inspect.signature(retrieval_draft.generate).parameters
    for name in ("tree_budget", "max_draft_len", "adaptive_tree", "draft_learning"):
        assert params[name].default == getattr(DEFAULTS, name)
    assert DraftConfig() == DEFAULTS


# (CLI flag, plugin keyword, a value out of the config's range): the CLI accepted --tree-budget 5000 and
# --seed 2**64 before the model loaded, and said "--tree-budget must be at least 0" where the plugin said
# "tree_budget must be an integer in 0..4096".
REFUSED = [("--tree-budget", "tree_budget", -1), ("--tree-budget", "tree_budget", 5000),
           ("--max-draft-len", "max_draft_len", 0), ("--seed", "draft_seed", 2**64)]


@pytest.mark.parametrize("flag, keyword, value", REFUSED)
def test_the_cli_refuses_a_drafting_setting_by_the_plugins_rule_and_message_before_the_model_loads(
    flag, keyword, value, capsys, monkeypatch
):
    import retrieval_draft.sessions.session as session
    from retrieval_draft.plugin.keywords import plugin_keywords
    from retrieval_draft_datastore.cli import main

    monkeypatch.setattr(session, "load_session", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(InvalidInputError) as refused:
        plugin_keywords(1, **{keyword: value})
    capsys.readouterr()
    assert main(["generate", "--prompt", "hi", flag, str(value)]) == 2
    assert capsys.readouterr().err == f"error: {flag}: {refused.value}\n"


@pytest.mark.parametrize("budget", [-1, 5000, 2.5])
def test_a_planner_refuses_a_tree_budget_by_the_configs_rule(budget):
    from retrieval_draft.planning.planner import TreePlanner

    with pytest.raises(InvalidInputError) as refused:
        TreePlanner(tree_budget=budget)
    with pytest.raises(InvalidInputError) as by_config:
        DraftConfig(tree_budget=budget)
    assert str(refused.value) == str(by_config.value)


def test_a_callers_planner_sizes_the_kv_reserve_by_its_own_tree_budget(monkeypatch):
    import retrieval_draft.plugin.hf as hf
    from retrieval_draft.planning.planner import TreePlanner

    reserves = []

    class Recording(hf.TreeModel):
        def prefill(self, *args, **kwargs):
            reserves.append(self.reserve)
            return super().prefill(*args, **kwargs)

    monkeypatch.setattr(hf, "TreeModel", Recording)
    model = make_tiny_llama(seed=92)
    prompt = random_prompt(92)
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False,
                   custom_generate=retrieval_draft.generate, draft_planner=TreePlanner(tree_budget=3), tree_budget=64,
                   eos_token_id=None, pad_token_id=0)
    model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=5, do_sample=False,
                   custom_generate=retrieval_draft.generate, tree_budget=64, eos_token_id=None, pad_token_id=0)
    assert reserves == [5 + 3 + 1, 5 + 64 + 1]
