"""tools/replay.py walks trees against known outputs and bounds what selection can gain."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from replay import DEFAULT_CURVE, accepted_length, replay  # noqa: E402

from retrieval_draft.drafters.prompt_lookup import PromptLookupDrafter  # noqa: E402
from retrieval_draft.tree import merge_drafts  # noqa: E402
from retrieval_draft.drafters.base import Draft  # noqa: E402


def test_accepted_length_follows_the_matching_branch():
    tree = merge_drafts(0, [Draft(np.array([1, 2, 3]), np.full(3, 0.9)), Draft(np.array([1, 5]), np.full(2, 0.5))])
    assert accepted_length(tree, np.array([1, 5, 7])) == 2
    assert accepted_length(tree, np.array([1, 2, 3, 4])) == 3
    assert accepted_length(tree, np.array([9])) == 0


def test_replaying_a_copied_output_takes_many_tokens_per_step_and_the_ceiling_bounds_it():
    text = list(range(100, 160))
    ref = {"prompt": text + [7], "out": text[:48]}  # the model copies the prompt back
    drafters = lambda: [PromptLookupDrafter()]  # noqa: E731
    tokens_per_step, speedup = replay(ref, drafters, DEFAULT_CURVE, 32, 32, ceiling=False)
    best_tokens, best_speedup = replay(ref, drafters, DEFAULT_CURVE, 32, 32, ceiling=True)
    assert tokens_per_step > 4 and speedup > 1.5
    assert best_tokens >= tokens_per_step and best_speedup >= speedup


def test_replaying_unpredictable_output_is_plain_decoding():
    ref = {"prompt": [1, 2, 3], "out": list(range(200, 240))}  # nothing repeats
    tokens_per_step, speedup = replay(ref, lambda: [PromptLookupDrafter()], DEFAULT_CURVE, 32, 32, ceiling=False)
    assert tokens_per_step == 1.0
    assert 0.9 < speedup <= 1.0
