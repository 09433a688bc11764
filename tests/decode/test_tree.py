"""Token trees: merging drafts, pruning to a budget, masks and positions."""

import numpy as np
import pytest

from retrieval_draft.tree import DraftTree, build_tree
from retrieval_draft.draft import Draft


def draft(tokens, probs):
    return Draft(np.array(tokens), np.array(probs, dtype=float))


def test_drafts_sharing_a_prefix_share_its_nodes():
    tree = build_tree(7, [draft([1, 2, 3], [0.9, 0.9, 0.9]), draft([1, 2, 4], [0.5, 0.5, 0.5])], budget=10)
    assert tree.size == 5  # root, 1, 2, 3, 4
    assert tree.tokens.tolist() == [7, 1, 2, 3, 4]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2]
    assert tree.depths.tolist() == [0, 1, 2, 3, 3]


def test_shared_node_takes_the_best_drafts_probability():
    tree = build_tree(0, [draft([5, 6], [0.5, 0.5]), draft([5], [0.7])], budget=4)
    assert tree.probs[1] == pytest.approx(0.7)
    assert tree.probs[2] == pytest.approx(0.25)


def test_pruning_keeps_the_most_probable_nodes_and_their_ancestors():
    drafts = [draft([1, 2, 3, 4], [0.9, 0.9, 0.9, 0.9]), draft([5, 6], [0.3, 0.3])]
    tree = build_tree(0, drafts, budget=3)
    assert tree.tokens.tolist() == [0, 1, 2, 3]
    tree = build_tree(0, drafts, budget=5)
    assert sorted(tree.tokens.tolist()) == [0, 1, 2, 3, 4, 5]
    kept = set(range(tree.size))
    assert all(p in kept or p == -1 for p in tree.parents.tolist())


def test_zero_budget_gives_a_lone_root():
    tree = build_tree(9, [draft([1, 2], [1.0, 1.0])], budget=0)
    assert tree.size == 1 and tree.tokens.tolist() == [9]


def test_children_are_ordered_by_decreasing_probability():
    tree = build_tree(0, [draft([1], [0.2]), draft([2], [0.7]), draft([3], [0.5])], budget=3)
    order = [int(tree.tokens[c]) for c in tree.children()[0]]
    assert order == [2, 3, 1]


def test_ancestor_mask_is_self_plus_ancestors():
    tree = build_tree(0, [draft([1, 2], [0.9, 0.9]), draft([3], [0.5])], budget=3)
    mask = tree.ancestor_mask()
    expected = np.array(
        [
            [1, 0, 0, 0],  # root
            [1, 1, 0, 0],  # 1
            [1, 1, 1, 0],  # 2 under 1
            [1, 0, 0, 1],  # 3 under root
        ],
        dtype=bool,
    )
    assert (mask == expected).all()


def test_path_to_lists_nodes_from_the_root_down():
    tree = build_tree(0, [draft([1, 2, 3], [0.9, 0.9, 0.9])], budget=3)
    assert tree.path_to(3).tolist() == [1, 2, 3]
    assert tree.path_to(0).tolist() == []


def test_a_tree_out_of_topological_order_is_rejected():
    with pytest.raises(ValueError):
        DraftTree(
            tokens=np.array([0, 1, 2]),
            parents=np.array([-1, 2, 0]),
            depths=np.array([0, 2, 1]),
            probs=np.ones(3),
        )


def test_draft_probabilities_outside_zero_one_are_rejected():
    with pytest.raises(ValueError):
        draft([1], [1.5])
    with pytest.raises(ValueError):
        draft([1, 2], [0.5])


def test_likeliest_nodes_are_the_most_probable_in_node_order_root_first_ties_to_the_lower_index():
    tree = build_tree(0, [Draft(np.array([1, 2, 3]), np.array([0.9, 0.5, 0.5])), Draft(np.array([4, 5]), np.array([0.9, 0.8]))],
                      budget=10)
    # path probabilities by node: 1.0, .9, .45, .225, .9, .72
    np.testing.assert_allclose(tree.probs, [1.0, 0.9, 0.45, 0.225, 0.9, 0.72])
    assert tree.likeliest(3).tolist() == [0, 1, 4]
    assert tree.likeliest(4).tolist() == [0, 1, 4, 5]
    assert tree.likeliest(1).tolist() == [0]
    assert tree.likeliest(None).tolist() == tree.likeliest(6).tolist() == tree.likeliest(60).tolist() == list(range(6))


def test_ancestor_mask_of_random_trees_marks_exactly_each_nodes_path():
    rng = np.random.default_rng(2)
    for _ in range(100):
        n = int(rng.integers(1, 40))
        parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int64)
        depths = np.zeros(n, np.int64)
        for i in range(1, n):
            depths[i] = depths[parents[i]] + 1
        tree = DraftTree(tokens=rng.integers(0, 9, n), parents=parents, depths=depths, probs=np.ones(n))
        want = np.zeros((n, n), dtype=bool)
        for node in range(n):
            up = node
            while up >= 0:
                want[node, up] = True
                up = parents[up]
        assert np.array_equal(tree.ancestor_mask(), want)


def test_a_tree_packed_into_a_wider_row_pads_with_the_root_and_lone_slots():
    rng = np.random.default_rng(3)
    for _ in range(100):
        n = int(rng.integers(1, 30))
        width = n + int(rng.integers(0, 6))
        parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int64)
        depths = np.zeros(n, np.int64)
        for i in range(1, n):
            depths[i] = depths[parents[i]] + 1
        tree = DraftTree(tokens=rng.integers(0, 9, n), parents=parents, depths=depths, probs=np.ones(n))
        tokens, packed_depths = np.full(width, -7, np.int64), np.full(width, -7, np.int64)
        among = rng.integers(0, 2, (width, width)).astype(bool)  # stale contents: every cell is written
        tree.pack_into(tokens, packed_depths, among)
        assert tokens.tolist() == tree.tokens.tolist() + [int(tree.tokens[0])] * (width - n)
        assert packed_depths.tolist() == depths.tolist() + [0] * (width - n)
        want = np.eye(width, dtype=bool)
        want[:n, :n] = tree.ancestor_mask()
        assert np.array_equal(among, want)
