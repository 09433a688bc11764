"""tools.diagnostics.replay drives the real engine with a stand-in model and reproduces saved greedy outputs."""

import numpy as np
import torch

from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.tree import merge_drafts
from retrieval_draft.decode.verify import verify_greedy
from retrieval_draft.draft import Draft
from retrieval_draft.drafters.registry import DraftSources, make_drafters
from retrieval_draft.planning.planner import TreePlanner
from retrieval_draft.model.tree_model import TreeModel
from tools.diagnostics.replay import DEFAULT_CURVE, ReplayModel, replay

from tests.conftest import random_prompt


def prompt_lookup():
    return make_drafters(["prompt"], DraftSources())


def test_the_stand_in_model_makes_greedy_verification_follow_the_reference():
    model = ReplayModel(np.array([10, 11, 1, 5, 7, 8]))
    first = model.prefill(torch.tensor([[10, 11]]))
    assert first.shape == (1, model.vocab_size) and int(first[0].argmax()) == 1
    tree = merge_drafts(1, [Draft(np.array([2, 3]), np.full(2, 0.9)), Draft(np.array([5, 7, 9]), np.full(3, 0.5))])
    logits = model.score_trees([tree])[0]
    assert logits.shape == (tree.size, model.vocab_size)
    verdict = verify_greedy(tree, logits)
    assert tree.tokens[verdict.accepted].tolist() == [5, 7] and verdict.bonus == 8
    off_path = [i for i in range(tree.size) if tree.tokens[i] in (2, 3, 9)]
    assert all(int(logits[i].argmax()) == model.miss for i in off_path)


def test_replaying_a_copied_output_reproduces_it_in_many_tokens_per_step_and_the_ceiling_bounds_it():
    text = list(range(100, 160))
    ref = {"prompt": text + [7], "out": text[:48]}  # the model copies the prompt back
    result = replay(ref, prompt_lookup(), DEFAULT_CURVE, 32, 32)
    best = replay(ref, prompt_lookup(), DEFAULT_CURVE, 32, 32, ceiling=True)
    assert result.output.tolist() == ref["out"] and best.output.tolist() == ref["out"]
    assert result.tokens_per_step > 4 and result.speedup > 1.5
    assert best.tokens_per_step >= result.tokens_per_step and best.speedup >= result.speedup


def test_replaying_unpredictable_output_is_plain_decoding():
    ref = {"prompt": [1, 2, 3], "out": list(range(200, 240))}  # nothing repeats
    result = replay(ref, prompt_lookup(), DEFAULT_CURVE, 32, 32)
    assert result.output.tolist() == ref["out"]
    assert result.tokens_per_step == 1.0 and result.stats.steps == 39  # the prefill gives the first token
    assert 0.9 < result.speedup <= 1.0


def test_replay_reproduces_an_output_whose_copies_go_wrong_on_the_way():
    rng = np.random.default_rng(0)
    phrase = rng.integers(300, 340, size=6).tolist()
    out = [t for _ in range(5) for t in phrase + rng.integers(340, 380, size=3).tolist()]  # new filler each time
    result = replay({"prompt": [1, 2], "out": out}, prompt_lookup(), DEFAULT_CURVE, 8, 16)
    assert result.output.tolist() == out and result.stats.new_tokens == len(out)
    assert result.tokens_per_step > 1.0


def test_the_stand_in_verifies_every_tree_as_the_real_model_did(tiny_llama):
    prompt, options = random_prompt(2, repeat=3), DecodeOptions(max_new_tokens=40)  # many drafts rejected
    (real,), expected = speculative_decode(
        TreeModel(tiny_llama), prompt, [prompt_lookup()], options, planner=TreePlanner(16)
    )
    stand_in = ReplayModel(np.concatenate([prompt[0].numpy(), real]))
    (out,), stats = speculative_decode(stand_in, prompt, [prompt_lookup()], options, planner=TreePlanner(16))
    assert np.array_equal(out, real) and expected.tree_nodes > expected.step_tokens  # some drafts were rejected
    counts = lambda s: (s.steps, s.step_tokens, s.tree_nodes)  # noqa: E731
    assert counts(stats) == counts(expected)
