"""Every ``generate`` keyword of ours is checked by type and range before the prefill; names
work as on the command line; the errors are importable from ``retrieval_draft``."""

from __future__ import annotations

import inspect
from dataclasses import fields

import numpy as np
import pytest
import torch

import retrieval_draft
import retrieval_draft.errors as errors
from retrieval_draft.config import DraftConfig
from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter
from retrieval_draft.plugin.keywords import plugin_keywords
from retrieval_draft_datastore.builder import build
from tests.conftest import make_tiny_llama, random_prompt
from tests.datastore_fixtures import word_tokenizer

WORDS = "a b c d e f x y z q".split()

# DraftConfig's settings: wrong values by the kind of the default (each names the setting)
BAD_BY_KIND = {
    int: ["8", 2.5, True, None, -1, 10**30],
    bool: ["no", "False", "yes", 0, 1, None],
    type(None): ["x", 1.5, True, 2**64, -(2**63) - 1, [1]],  # draft_seed: None or an integer
}
BAD = {field.name: BAD_BY_KIND[type(field.default)] for field in fields(DraftConfig)}
BAD.update({  # the objects: keyword -> values a user plausibly gives that must be refused
    "drafters": [["bogus"], "prompt,bogus", [PromptLookupDrafter(), "prompt"], 3, [[PromptLookupDrafter()]] * 2],
    "draft_tokenizer": ["gpt2", 3],
    "draft_planner": ["planner", 4],
    "draft_streamer": ["stdout", print, [object()]],
    "draft_stats": [{}, "stats"],
    "draft_memory": [{}, "memory"],
    "datastore": [3, [], [3.5]],
})


def test_the_table_covers_every_keyword_of_ours():
    """Ours: every parameter after ``generate``'s own (the last of which is ``assistant_model``)."""
    params = list(inspect.signature(retrieval_draft.generate).parameters.values())
    start = [p.name for p in params].index("assistant_model") + 1
    ours = {p.name for p in params[start:] if p.kind is not inspect.Parameter.VAR_KEYWORD}
    assert ours == set(BAD)


@pytest.fixture(scope="module")
def model():
    model = make_tiny_llama(seed=93)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    model.forwards = forwards
    return model


@pytest.mark.parametrize("keyword, value", [(k, v) for k, values in BAD.items() for v in values],
                         ids=lambda value: repr(value)[:20])
def test_a_wrong_value_is_refused_by_name_before_any_forward(model, keyword, value):
    prompt = random_prompt(93)
    model.forwards.clear()
    with pytest.raises(retrieval_draft.InvalidInputError, match=keyword if keyword != "drafters" else "drafter"):
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                       custom_generate=retrieval_draft.generate, **{keyword: value})
    assert model.forwards == []


def test_a_wrong_value_gives_one_line_naming_what_the_keyword_takes():
    with pytest.raises(retrieval_draft.InvalidInputError) as caught:
        plugin_keywords(1, draft_learning="yes")
    assert str(caught.value) == "draft_learning must be True or False, got 'yes' (str)"
    with pytest.raises(retrieval_draft.InvalidInputError) as caught:
        plugin_keywords(1, drafters=[3])
    message = str(caught.value)
    assert "\n" not in message and "prompt, ngram, suffix" in message and "a list of 1 (int)" in message


def test_a_value_whose_repr_spans_lines_is_shown_on_one_short_line():
    """Found by the keyword fuzz test: a tokenizer given as tree_budget printed its whole repr."""
    tokenizer = word_tokenizer(WORDS)
    with pytest.raises(retrieval_draft.InvalidInputError) as caught:
        plugin_keywords(1, tree_budget=tokenizer)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 160 and message.endswith(f"({type(tokenizer).__name__})")


def test_an_empty_drafter_list_decodes_without_drafts_and_matches_greedy():
    model = make_tiny_llama(seed=94)
    prompt = random_prompt(94, repeat=2)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    stats = retrieval_draft.DecodeStats()
    got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
                         custom_generate=retrieval_draft.generate, drafters=[], draft_stats=stats)
    assert torch.equal(got, expected) and stats.tree_nodes == stats.steps  # each tree its root alone


@pytest.mark.parametrize("drafters", [["prompt"], "prompt", ("prompt", "recycle"), "prompt, history"])
def test_drafter_names_work_as_on_the_command_line(drafters):
    model = make_tiny_llama(seed=95)
    prompt = random_prompt(95, repeat=3)
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    stats = retrieval_draft.DecodeStats()
    got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False,
                         custom_generate=retrieval_draft.generate, drafters=drafters, draft_stats=stats,
                         draft_memory=retrieval_draft.PluginMemory(persist=False))
    assert torch.equal(got, expected)
    assert stats.tree_nodes > stats.steps  # the repeated prompt gives drafts beyond the roots to verify


def test_a_name_whose_source_is_missing_is_refused_with_what_it_needs():
    model = make_tiny_llama(seed=96)
    prompt = random_prompt(96)
    with pytest.raises(retrieval_draft.InvalidInputError, match="ngram drafter needs a datastore"):
        model.generate(prompt, max_new_tokens=4, custom_generate=retrieval_draft.generate, drafters=["prompt", "ngram"])
    with pytest.raises(retrieval_draft.InvalidInputError, match="history drafter needs an output history"):
        model.generate(prompt, max_new_tokens=4, custom_generate=retrieval_draft.generate, drafters="history",
                       draft_learning=False)


def test_numpy_scalars_are_taken_as_their_values():
    keywords = plugin_keywords(1, tree_budget=np.int64(8), max_draft_len=np.int32(4), adaptive_tree=np.bool_(False),
                               draft_learning=np.True_, draft_seed=np.uint64(7))
    config = keywords.config
    assert (config.tree_budget, config.max_draft_len, config.adaptive_tree, config.draft_learning, config.draft_seed) \
        == (8, 4, False, True, 7)
    assert all(type(value) in (int, bool) for value in vars(config).values())


def test_the_engine_checks_its_draft_length_through_the_one_config_check():
    with pytest.raises(retrieval_draft.InvalidInputError) as engine_error:
        retrieval_draft.DecodeOptions(max_new_tokens=4, max_draft_len=0)
    with pytest.raises(retrieval_draft.InvalidInputError) as keyword_error:
        plugin_keywords(1, max_draft_len=0)
    assert str(engine_error.value) == str(keyword_error.value)


def test_every_public_error_is_importable_from_the_package():
    public = {name for name, value in vars(errors).items()
              if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == errors.__name__}
    assert "InvalidInputError" in public
    for name in public:
        assert getattr(retrieval_draft, name) is getattr(errors, name)
        assert name in retrieval_draft.__all__


@pytest.fixture(scope="module")
def word_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("word-store")
    (root / "doc.txt").write_text("a b c d e a b c d e f x y z")
    build([str(root / "doc.txt")], root / "store", word_tokenizer(WORDS), progress=False)
    return root / "store"


@pytest.mark.parametrize("keyword", ["tokenizer", "draft_tokenizer"])
def test_a_store_of_another_tokenizer_is_refused_when_the_models_tokenizer_is_given(word_store, keyword):
    """``generate``'s own ``tokenizer=`` checks the store's fingerprint as ``draft_tokenizer=`` does."""
    model = make_tiny_llama(seed=97, vocab_size=64)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    prompt = torch.tensor([[1, 2, 3, 4]])
    other = word_tokenizer(list(reversed(WORDS)))
    with pytest.raises(retrieval_draft.TokenizerMismatchError, match="different tokenizer"):
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4,
                       custom_generate=retrieval_draft.generate, datastore=word_store, **{keyword: other},
                       draft_memory=retrieval_draft.PluginMemory(persist=False))
    assert forwards == []
    got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False,
                         custom_generate=retrieval_draft.generate, datastore=word_store,
                         **{keyword: word_tokenizer(WORDS)}, draft_memory=retrieval_draft.PluginMemory(persist=False))
    assert got.shape == (1, 8)


def test_a_store_with_drafter_instances_is_refused_rather_than_ignored(word_store):
    with pytest.raises(retrieval_draft.InvalidInputError, match="datastore= drafts through the default drafters"):
        plugin_keywords(1, drafters=[PromptLookupDrafter()], datastore=word_store)
    assert plugin_keywords(1, drafters=["prompt", "ngram"], datastore=word_store).names == ("prompt", "ngram")


def test_counts_in_messages_are_singular_for_one_and_plural_otherwise():
    """"one list per row (1 row)", not "(1 rows)"."""
    for rows, shown in ((1, "(1 row)"), (2, "(2 rows)")):
        with pytest.raises(retrieval_draft.InvalidInputError) as caught:
            plugin_keywords(rows, drafters=[[PromptLookupDrafter()]] * (rows + 1))
        assert f"one list per row {shown} of instances" in str(caught.value)
    with pytest.raises(retrieval_draft.InvalidInputError) as caught:
        plugin_keywords(1, draft_streamer=[object(), object()])
    assert "for 1 row takes a list of 1 streamer," in str(caught.value)
