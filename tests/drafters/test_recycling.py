"""Logits recycling: the table records what verification computed, drafts best first, and round-trips to disk."""

import numpy as np
import pytest
import torch

import retrieval_draft
from retrieval_draft.drafters.recycling import EMPTY, RecyclingDrafter
from retrieval_draft.errors import CorruptRecyclingTableError, InvalidInputError, TokenizerMismatchError
from retrieval_draft.sessions.memory import PluginMemory
from tests.conftest import TINY_VOCAB, random_prompt
from tests.datastore_fixtures import word_tokenizer


def logits_with(top: list[list[int]], vocab: int = 10) -> torch.Tensor:
    """Rows of logits whose ranking starts with ``top[i]`` (descending), the rest far below."""
    rows = torch.full((len(top), vocab), -20.0)
    for i, ranked in enumerate(top):
        for rank, token in enumerate(ranked):
            rows[i, token] = 10.0 - rank
    return rows


def test_observing_a_tree_records_each_nodes_top_k_with_model_probabilities():
    drafter = RecyclingDrafter(10, k=2)
    logits = logits_with([[4, 5, 6], [7, 1]])
    drafter.observe_tree(np.array([3, 9]), logits)
    assert drafter.successors[3].tolist() == [4, 5]
    assert drafter.successors[9].tolist() == [7, 1]
    expected = torch.softmax(logits, dim=-1)
    np.testing.assert_allclose(drafter.probs[3], expected[0, [4, 5]].numpy(), rtol=1e-5)
    assert drafter.filled == 2 and drafter.successors[0, 0] == EMPTY


def test_a_later_observation_of_a_token_replaces_the_earlier_one():
    drafter = RecyclingDrafter(10, k=2)
    drafter.observe_tree(np.array([3]), logits_with([[4, 5]]))
    drafter.observe_tree(np.array([3]), logits_with([[8, 2]]))
    assert drafter.successors[3].tolist() == [8, 2]


def test_nothing_recorded_after_the_last_token_means_no_drafts():
    drafter = RecyclingDrafter(10, k=2)
    drafter.observe_tree(np.array([3]), logits_with([[4, 5]]))
    assert drafter.propose(np.array([1, 2, 7]), 8) == []


def table_drafter(max_nodes: int) -> RecyclingDrafter:
    """1 -> 2 (0.6) | 3 (0.3); 2 -> 4 (0.9) | 5 (0.05); 4 -> 6 (0.5); 3 -> 7 (0.9)."""
    drafter = RecyclingDrafter(10, k=2, max_nodes=max_nodes)
    for token, successors in {1: [(2, 0.6), (3, 0.3)], 2: [(4, 0.9), (5, 0.05)], 4: [(6, 0.5)], 3: [(7, 0.9)]}.items():
        for rank, (successor, prob) in enumerate(successors):
            drafter.successors[token, rank], drafter.probs[token, rank] = successor, prob
    return drafter


def test_drafts_grow_best_first_by_path_probability():
    # path probabilities: 2 .6, 4 .54, 3 .3, 6 .27, 7 .27, 5 .03
    drafts = table_drafter(max_nodes=3).propose(np.array([0, 1]), 8)
    assert sorted(d.tokens.tolist() for d in drafts) == [[2, 4], [3]]
    by_path = {tuple(d.tokens.tolist()): d.probs.tolist() for d in drafts}
    np.testing.assert_allclose(by_path[(2, 4)], [0.6, 0.9], rtol=1e-6)
    every = table_drafter(max_nodes=16).propose(np.array([1]), 8)
    assert sorted(d.tokens.tolist() for d in every) == [[2, 4, 6], [2, 5], [3, 7]]


def test_drafts_stop_at_max_len():
    drafts = table_drafter(max_nodes=16).propose(np.array([1]), 1)
    assert sorted(d.tokens.tolist() for d in drafts) == [[2], [3]]


def test_nonsense_sizes_are_refused():
    with pytest.raises(InvalidInputError):
        RecyclingDrafter(10, k=0)


def test_a_saved_table_loads_back_equal(tmp_path):
    words = word_tokenizer("a b c d e f".split())
    drafter = table_drafter(max_nodes=4)
    drafter.save(tmp_path / "table.npz", tokenizer=words)
    loaded = RecyclingDrafter.load(tmp_path / "table.npz", vocab_size=10, tokenizer=words, max_nodes=4)
    assert np.array_equal(loaded.successors, drafter.successors) and np.array_equal(loaded.probs, drafter.probs)
    assert [d.tokens.tolist() for d in loaded.propose(np.array([1]), 8)] == [
        d.tokens.tolist() for d in drafter.propose(np.array([1]), 8)
    ]


def test_a_truncated_table_file_is_a_typed_error(tmp_path):
    path = tmp_path / "table.npz"
    table_drafter(4).save(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptRecyclingTableError):
        RecyclingDrafter.load(path, vocab_size=10)


def test_a_table_for_another_vocabulary_is_a_typed_error(tmp_path):
    path = tmp_path / "table.npz"
    table_drafter(4).save(path)
    with pytest.raises(CorruptRecyclingTableError, match="10 token ids"):
        RecyclingDrafter.load(path, vocab_size=12)


def test_out_of_range_successors_are_a_typed_error(tmp_path):
    path = tmp_path / "table.npz"
    drafter = table_drafter(4)
    drafter.successors[5, 0] = 10
    drafter.save(path)
    with pytest.raises(CorruptRecyclingTableError, match="outside"):
        RecyclingDrafter.load(path, vocab_size=10)


def test_a_table_from_another_tokenizer_is_refused(tmp_path):
    path = tmp_path / "table.npz"
    table_drafter(4).save(path, tokenizer=word_tokenizer("a b c d e f".split()))
    with pytest.raises(TokenizerMismatchError):
        RecyclingDrafter.load(path, vocab_size=10, tokenizer=word_tokenizer("k l m n o p".split()))


def test_the_plugin_fills_the_models_table_and_keeps_it_across_calls(tiny_llama):
    memory = PluginMemory(persist=False)
    prompt = random_prompt(3, length=10, repeat=2)
    out = tiny_llama.generate(prompt, max_new_tokens=20, custom_generate=retrieval_draft.generate, draft_memory=memory)
    assert torch.equal(out, tiny_llama.generate(prompt, max_new_tokens=20, do_sample=False))
    table = memory.recycled(tiny_llama)
    # the first step asks every drafter (the gate has seen none): its root, the prefill's token, was recorded
    recorded = set(np.flatnonzero(table.successors[:, 0] != EMPTY).tolist())
    assert int(out[0, prompt.shape[1]]) in recorded and table.vocab_size == TINY_VOCAB
    tiny_llama.generate(random_prompt(4, length=10), max_new_tokens=20, custom_generate=retrieval_draft.generate, draft_memory=memory)
    assert memory.recycled(tiny_llama) is table and table.filled >= len(recorded)


def test_recycled_greedy_drafts_keep_the_output_identical(tiny_llama):
    drafter = RecyclingDrafter(TINY_VOCAB, k=4)
    for seed in range(6):
        prompt = random_prompt(seed, length=12, repeat=2)
        expected = tiny_llama.generate(prompt, max_new_tokens=24, do_sample=False)
        got = tiny_llama.generate(
            prompt, max_new_tokens=24, custom_generate=retrieval_draft.generate, drafters=[drafter],
            adaptive_tree=False, tree_budget=8,
        )
        assert torch.equal(got, expected), seed


def test_a_batch_fills_the_shared_table_from_every_row(tiny_llama):
    memory = PluginMemory(persist=False)
    ids = torch.cat([random_prompt(5, length=10), random_prompt(6, length=10)])
    out = tiny_llama.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, custom_generate=retrieval_draft.generate,
        draft_memory=memory,
    )
    assert torch.equal(out, tiny_llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False))
    recorded = set(np.flatnonzero(memory.recycled(tiny_llama).successors[:, 0] != EMPTY).tolist())
    for row in range(2):  # the first step asks every drafter: each row's first tree, rooted at its prefill token
        assert int(out[row, ids.shape[1]]) in recorded, row


def _heap_reference(drafter, root: int, max_len: int) -> list[tuple[list[int], list[float]]]:
    """The best-first expansion written with heapq (the drafter's first implementation): leaves'
    paths as (tokens, conditionals), leaves in node order."""
    import heapq

    tokens, parents, conditional, depths, has_child = [root], [-1], [1.0], [0], [False]
    frontier: list = []

    def push(node, token, path):
        for successor, prob in zip(drafter.successors[token].tolist(), drafter.probs[token].tolist()):
            if successor == -1 or prob <= 0.0:
                break
            heapq.heappush(frontier, (-path * prob, node, successor, min(prob, 1.0)))

    push(0, root, 1.0)
    while frontier and len(tokens) <= drafter.max_nodes:
        negative, parent, token, prob = heapq.heappop(frontier)
        node = len(tokens)
        tokens.append(token), parents.append(parent), conditional.append(prob)
        depths.append(depths[parent] + 1), has_child.append(False)
        has_child[parent] = True
        if depths[node] < max_len:
            push(node, token, -negative)
    paths = []
    for leaf in range(1, len(tokens)):
        if not has_child[leaf]:
            path, cursor = [], leaf
            while cursor > 0:
                path.append(cursor)
                cursor = parents[cursor]
            paths.append(([tokens[i] for i in reversed(path)], [conditional[i] for i in reversed(path)]))
    return paths


def test_the_compiled_best_first_tree_equals_the_heap_expansion_ties_included():
    rng = np.random.default_rng(3)
    for trial in range(40):
        vocab, k = 12, int(rng.integers(1, 5))
        drafter = RecyclingDrafter(vocab, k=k, max_nodes=int(rng.integers(1, 20)))
        # few distinct probabilities, so equal path probabilities (ties) are common; some rows short
        drafter.successors[:] = rng.integers(0, vocab, size=(vocab, k))
        drafter.probs[:] = rng.choice(np.array([0.5, 0.25, 1.0, 0.125], dtype=np.float32), size=(vocab, k))
        short = rng.random(vocab) < 0.3
        drafter.successors[short, k // 2 :] = -1
        root, max_len = int(rng.integers(0, vocab)), int(rng.integers(1, 6))
        got = [(d.tokens.tolist(), d.probs.tolist()) for d in drafter.propose(np.array([root]), max_len)]
        assert got == _heap_reference(drafter, root, max_len), trial
