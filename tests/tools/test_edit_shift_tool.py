"""The edit-shift diagnostic: keys moved by re-rotation equal keys computed at the new positions, and
the moved chunk after an edit is found and placed where the edited prompt has it."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tests.conftest import make_tiny_llama, random_prompt
from tools.diagnostics.edit_shift import compare, shift_keys


def test_re_rotated_keys_equal_keys_computed_that_many_positions_later():
    model = make_tiny_llama(seed=3)
    ids = random_prompt(5, 20)
    here, later = DynamicCache(), DynamicCache()
    with torch.no_grad():
        model(ids, past_key_values=here, use_cache=True)
        model(ids, position_ids=torch.arange(7, 27)[None], past_key_values=later, use_cache=True)
    for a, b in zip(here.layers, later.layers):
        assert torch.allclose(shift_keys(model, a.keys, 7), b.keys, atol=1e-5)
        assert not torch.allclose(a.keys, b.keys, atol=1e-3)


def test_the_chunk_after_an_edit_is_moved_by_the_edits_length():
    model = make_tiny_llama(seed=4)
    old = random_prompt(6, 40)[0].tolist()
    new = old[:10] + [7, 8] + old[11:]  # one token replaced by two: everything after moves one place
    result = compare(model, old, new, new_tokens=4)
    assert (result["prefix"], result["edit_tokens"], result["shift"]) == (10, 2, 1)
    assert result["moved"] == len(new) - 1 - 12  # all of the rest but the last token, which is run
    assert result["new_tokens"] == 4 and 0 <= result["tokens_agreeing"] <= 4
