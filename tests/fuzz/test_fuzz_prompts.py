"""Random prompts through the plugin: random ids (now and then one out of range), lengths from one
token to past the tiny model's 256 positions, batches of one to three rows with left padding, right
padding, holes or rows of padding only. Either the prompt is one the plugin serves and the output
is HF greedy ``generate``'s, token for token, or it is refused with a typed one-line error before
any forward.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import retrieval_draft
from retrieval_draft.errors import InvalidInputError
from tests.conftest import TINY_VOCAB, make_tiny_llama
from tests.fuzz.profiles import examples

LIMIT = 256  # make_tiny_llama's max_position_embeddings

# a row's padding: mostly what the plugin serves (none, left), now and then what it refuses
PADDING = st.tuples(st.sampled_from(["none"] * 4 + ["left"] * 4 + ["right", "hole", "all", "two"]), st.integers(1, 40))


@st.composite
def prompts(draw) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, L) int64."""
    rows = draw(st.integers(1, 3))
    length = draw(st.one_of(st.integers(1, 48), st.integers(1, 48), st.integers(LIMIT - 24, LIMIT + 8)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    period = draw(st.sampled_from([0, 1, 3, 7, 16]))  # 0: no repetition; else a repeated block drafts well
    ids = rng.integers(0, TINY_VOCAB, size=(rows, length))
    if period:
        ids = np.resize(ids[:, :period], (rows, length)) if period < length else ids
    bad = draw(st.sampled_from([None] * 8 + ["high", "negative"]))
    if bad is not None:
        ids[rng.integers(rows), rng.integers(length)] = TINY_VOCAB + 3 if bad == "high" else -1
    mask = np.ones((rows, length), dtype=np.int64)
    for row in range(rows):
        kind, amount = draw(PADDING)
        amount = min(amount, length)
        if kind == "left":
            mask[row, :amount] = 0
        elif kind == "right":
            mask[row, length - amount :] = 0
        elif kind == "hole" and length > 2:
            mask[row, 1 + amount % (length - 2)] = 0
        elif kind == "all":
            mask[row] = 0
        elif kind == "two":
            mask[row, amount % length] = 2
    return torch.from_numpy(ids), torch.from_numpy(mask)


def served(ids: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether the plugin serves this prompt, by its documented rule (not by its code): ids in the
    vocabulary, a mask of 0 and 1, left padding only, no empty row, and fewer real tokens than the
    model's context."""
    rows_real = mask.sum(dim=1)
    left_padded = bool((mask[:, :-1] <= mask[:, 1:]).all()) if mask.shape[1] > 1 else True
    return (bool(((mask == 0) | (mask == 1)).all()) and left_padded and bool((rows_real > 0).all())
            and int(ids.min()) >= 0 and int(ids.max()) < TINY_VOCAB and int(rows_real.max()) < LIMIT)


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny_llama(seed=5)
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    return model, forwards, retrieval_draft.PluginMemory(persist=False)


@settings(max_examples=examples(60))
@given(prompt=prompts(), new_tokens=st.integers(1, 16))
def test_a_random_prompt_gives_hf_greedys_output_or_one_typed_line(tiny, prompt, new_tokens):
    model, forwards, memory = tiny
    ids, mask = prompt
    forwards.clear()
    if not served(ids, mask):
        with pytest.raises(InvalidInputError) as refused:
            model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                           custom_generate=retrieval_draft.generate, draft_memory=memory)
        assert "\n" not in str(refused.value) and forwards == []
        event("refused before any forward")
        return
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
    got = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                         custom_generate=retrieval_draft.generate, draft_memory=memory)
    assert torch.equal(got, expected)
    event(f"served: {ids.shape[0]} row(s), {'past' if ids.shape[1] + new_tokens > LIMIT else 'within'} the context")
