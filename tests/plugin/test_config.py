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
