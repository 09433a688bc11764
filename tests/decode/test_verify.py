"""Greedy verification on hand-made logits."""

import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from retrieval_draft.tree import build_tree
from retrieval_draft.decode.verify import TreeJob, verify_greedy, verify_trees
from retrieval_draft.draft import Draft, Drafter
from retrieval_draft.model import transfer

VOCAB = 10


def logits_choosing(choices):
    """Shape (n, VOCAB) logits whose argmax at row i is choices[i]."""
    out = torch.zeros(len(choices), VOCAB)
    for row, token in enumerate(choices):
        out[row, token] = 5.0
    return out


def chain_tree(tokens):
    return build_tree(0, [Draft(np.array(tokens), np.full(len(tokens), 0.9))], budget=len(tokens))


def test_all_drafts_accepted_when_the_model_agrees():
    tree = chain_tree([3, 4, 5])
    verdict = verify_greedy(tree, logits_choosing([3, 4, 5, 6]))
    assert verdict.accepted.tolist() == [1, 2, 3]
    assert verdict.bonus == 6


def test_no_draft_accepted_when_the_first_disagrees():
    tree = chain_tree([3, 4, 5])
    verdict = verify_greedy(tree, logits_choosing([7, 4, 5, 6]))
    assert verdict.accepted.tolist() == []
    assert verdict.bonus == 7


def test_acceptance_stops_at_the_first_disagreement():
    tree = chain_tree([3, 4, 5])
    verdict = verify_greedy(tree, logits_choosing([3, 9, 5, 6]))
    assert verdict.accepted.tolist() == [1]
    assert verdict.bonus == 9


def test_the_branch_the_model_picks_is_followed():
    drafts = [Draft(np.array([3, 4]), np.array([0.9, 0.9])), Draft(np.array([5, 6]), np.array([0.5, 0.5]))]
    tree = build_tree(0, drafts, budget=4)
    node_of = {int(t): i for i, t in enumerate(tree.tokens)}
    choices = [0] * tree.size
    choices[0] = 5
    choices[node_of[5]] = 6
    choices[node_of[6]] = 8
    verdict = verify_greedy(tree, logits_choosing(choices))
    assert tree.tokens[verdict.accepted].tolist() == [5, 6]
    assert verdict.bonus == 8


def test_processor_sees_each_nodes_own_prefix():
    # Repetition penalty makes token 3 lose against 4 once 3 is in the prefix.
    tree = chain_tree([3, 3])
    logits = torch.zeros(3, VOCAB)
    logits[:, 3] = 2.0
    logits[:, 4] = 1.5
    processor = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(penalty=2.0)])
    prefix = torch.tensor([1, 0])
    verdict = verify_greedy(tree, logits, processor, prefix)
    # At the root the prefix has no 3: 3 wins and the first draft is accepted;
    # below it the prefix holds a 3, so 4 wins and the second draft is rejected.
    assert verdict.accepted.tolist() == [1]
    assert verdict.bonus == 4


class RowRecorder(Drafter):
    """An observer that records, for each tree, the tokens it is handed and the first two
    logits of the rows it asked for (their float bit patterns as its columns)."""

    name = "recorder"
    observes_trees = True
    max_observed_nodes = 3

    def __init__(self) -> None:
        self.seen: list[tuple[list[int], np.ndarray]] = []

    def tree_request(self, logits, nodes):
        rows = torch.cat([part[torch.from_numpy(chosen)] for part, chosen in zip(logits, nodes)])
        return rows[:, :2].contiguous().view(torch.int32)

    def tree_receive(self, tokens, columns):
        self.seen.append((tokens.tolist(), columns.view(np.float32).copy()))


@pytest.mark.parametrize("route", ["one read on the host", "one read on a device", "node by node"])
def test_every_route_hands_an_observer_the_likeliest_nodes_and_their_own_rows(route, monkeypatch):
    tree = build_tree(0, [Draft(np.array([1, 2, 3]), np.array([0.9, 0.5, 0.5])),
                          Draft(np.array([4, 5]), np.array([0.9, 0.8]))], budget=10)
    logits = torch.randn(tree.size, 12, generator=torch.Generator().manual_seed(0))
    if route == "one read on a device":
        monkeypatch.setattr(transfer, "computes_on_host", lambda _: False)
    recorder = RowRecorder()
    job = TreeJob(tree, np.arange(4), generator=torch.Generator().manual_seed(1), observers=[recorder])
    _, observed = verify_trees([job], logits[None], do_sample=route == "node by node")
    assert observed[0]["recorder"] > 0  # what recording cost, charged to the observer
    (tokens, rows), = recorder.seen
    likeliest = [0, 1, 4]  # path probabilities 1.0, .9, .45, .225, .9, .72
    assert tokens == tree.tokens[likeliest].tolist()
    np.testing.assert_array_equal(rows, logits[likeliest, :2].numpy())


def reference_walk(tree, picks):
    """Accepted nodes and bonus by following each node's pick among its children, in plain Python."""
    node, accepted = 0, []
    while True:
        children = [i for i in range(1, tree.size) if tree.parents[i] == node and tree.tokens[i] == picks[node]]
        if not children:
            return accepted, int(picks[node])
        node = children[0]
        accepted.append(node)


@pytest.mark.parametrize("seed", range(8))
def test_the_walk_follows_the_picks_and_a_lazy_walk_computes_only_the_path(seed):
    from retrieval_draft.decode.verify import walk

    generator = np.random.default_rng(seed)
    lengths = generator.integers(1, 6, 6)
    drafts = [Draft(generator.integers(0, 4, n), np.full(n, 0.9)) for n in lengths]
    tree = build_tree(0, drafts, budget=40)
    picks = generator.integers(0, 4, tree.size)
    accepted, bonus = reference_walk(tree, picks)
    verdict = walk(tree, picks)
    assert verdict.accepted.tolist() == accepted and verdict.bonus == bonus
    asked = []
    lazy = walk(tree, lambda node: asked.append(node) or int(picks[node]))
    assert lazy.accepted.tolist() == accepted and lazy.bonus == bonus
    assert asked == [0, *accepted]  # each node on the path once, nothing else


def random_batch(rng, sizes_kind):
    """Trees of one batch (equal sizes: lone roots, or all of one size; or mixed) and their
    (B, W, V) logits with ties and NaN, picks often matching the drafts."""
    trees = []
    for row in range(6):
        if sizes_kind == "lone roots":
            drafts = []
        elif sizes_kind == "one size":
            drafts = [Draft(rng.integers(0, 4, 3), np.full(3, 0.9))]
        else:
            drafts = [Draft(rng.integers(0, 4, n), np.full(n, 0.9)) for n in rng.integers(1, 5, row % 3)]
        trees.append(build_tree(int(rng.integers(0, 4)), drafts, budget=12))
    width = max(tree.size for tree in trees)
    logits = torch.from_numpy(rng.integers(0, 3, (len(trees), width, 6)).astype(np.float32))  # ties
    logits[0, 0, 2] = float("nan")
    return trees, logits


@pytest.mark.parametrize("device_path", [False, True])
@pytest.mark.parametrize("sizes_kind", ["lone roots", "one size", "mixed"])
def test_a_batch_verified_together_equals_each_tree_verified_alone(sizes_kind, device_path, monkeypatch):
    from retrieval_draft.decode.verify import read_verdicts

    if device_path:
        monkeypatch.setattr(transfer, "computes_on_host", lambda _: False)
    rng = np.random.default_rng(7)
    for _ in range(20):
        trees, logits = random_batch(rng, sizes_kind)
        verdicts, _ = read_verdicts([TreeJob(tree, np.arange(3)) for tree in trees], logits, do_sample=False)
        for i, (tree, verdict) in enumerate(zip(trees, verdicts)):
            alone = verify_greedy(tree, logits[i, : tree.size])
            assert verdict.accepted.tolist() == alone.accepted.tolist() and verdict.bonus == alone.bonus


def test_picks_come_from_one_argmax_where_no_slot_is_padded_on_the_host_and_always_on_a_device():
    from retrieval_draft.decode.verify import picks_together

    assert picks_together([1, 1, 1], processed=False, on_host=True)
    assert picks_together([4, 4], processed=False, on_host=True)
    assert not picks_together([2, 1, 1], processed=False, on_host=True)
    assert picks_together([2, 1, 1], processed=False, on_host=False)
    assert not picks_together([1, 1], processed=True, on_host=False)
