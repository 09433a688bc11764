"""RowSlots: the per-row slot bookkeeping of the tree model's cache, without a model."""

import numpy as np

from retrieval_draft.model.row_slots import RowSlots


def two_rows(first: int, second: int) -> RowSlots:
    """Two left-padded prompts of ``first`` and ``second`` tokens."""
    length = max(first, second)
    visible = np.zeros((2, length), dtype=bool)
    visible[0, length - first :], visible[1, length - second :] = True, True
    positions = np.maximum(np.cumsum(visible, axis=1) - 1, 0)
    return RowSlots(visible, positions)


def test_prefill_state_gives_each_row_its_end_and_next_position():
    slots = two_rows(3, 5)
    assert slots.rows == 2 and slots.length == 5 and not slots.dense
    assert slots.ends.tolist() == [5, 5] and slots.next_pos.tolist() == [3, 5]
    assert RowSlots(np.ones((1, 4), dtype=bool), np.arange(4)[None]).dense


def test_dense_rows_accepting_alike_move_nothing_and_stay_dense():
    slots = RowSlots(np.ones((2, 4), dtype=bool), np.tile(np.arange(4), (2, 1)))
    slots.open(np.array([[4, 5, 6], [4, 5, 5]]))
    rows, sources, targets = slots.keep([np.array([0, 1]), np.array([0, 1])])
    assert rows.size == sources.size == targets.size == 0 and slots.dense and slots.length == 6
    assert slots.visible.shape == (2, 4)  # never extended while dense
    assert slots.ends.tolist() == [6, 6] and slots.next_pos.tolist() == [6, 6]


def test_rows_accepting_unlike_are_written_out_and_list_their_moves():
    slots = RowSlots(np.ones((2, 4), dtype=bool), np.tile(np.arange(4), (2, 1)))
    slots.open(np.array([[4, 5, 6], [4, 5, 5]]))
    rows, sources, targets = slots.keep([np.array([0, 2]), np.array([0])])
    # row 0 kept the root (slot 4, in place) and node 2 (slot 6), moved down to slot 5
    assert rows.tolist() == [0] and sources.tolist() == [6] and targets.tolist() == [5]
    assert not slots.dense and slots.length == 6
    assert slots.visible.tolist() == [[True] * 6, [True] * 5 + [False]]
    assert slots.slot_pos[0, 4:].tolist() == [4, 5] and slots.ends.tolist() == [6, 5]


def test_new_slots_stay_hidden_until_kept_and_a_dropped_row_gives_its_place_to_the_last():
    slots = two_rows(3, 5)
    slots.open(np.array([[3, 4], [5, 6]]))
    assert slots.length == 5 and slots.visible.shape == (2, 7) and not slots.visible[:, 5:].any()
    slots.keep([np.array([0]), np.array([0, 1])])
    assert slots.ends.tolist() == [6, 7] and slots.next_pos.tolist() == [4, 7]
    slots.drop(0)
    slots.settle()
    assert slots.rows == 1 and slots.ends.tolist() == [7] and slots.next_pos.tolist() == [7]
    assert slots.dense and slots.length == 7  # the row left sees every slot it holds


def reference_keep(slots: RowSlots, nodes: list[np.ndarray]):
    """What ``keep`` does, written plainly row by row: (visible, slot_pos, ends, next_pos, moves)."""
    base, dense = slots.length, slots.dense
    counts = [len(kept) for kept in nodes]
    visible, slot_pos = slots.visible.copy(), slots.slot_pos.copy()
    if dense and min(counts) != max(counts):
        length = base + max(counts)
        visible = np.ones((slots.rows, length), dtype=bool)
        slot_pos = np.tile(np.arange(length), (slots.rows, 1))
        dense = False
    ends, next_pos, moves = slots.ends.copy(), slots.next_pos.copy(), []
    for row, kept in enumerate(nodes):
        if not dense:
            visible[row, ends[row]:] = False
        for j, node in enumerate(kept):
            target = ends[row] + j
            if not dense:
                visible[row, target], slot_pos[row, target] = True, next_pos[row] + j
            if target != base + node:
                moves.append((row, base + node, target))
        ends[row] += len(kept)
        next_pos[row] += len(kept)
    length = int(ends.max())
    return dense, visible[:, :length], slot_pos[:, :length], ends, next_pos, moves


def test_keep_equals_the_row_by_row_reference_on_random_batches():
    """Random rows (padded unlike or dense), random trees opened, random accepted paths, several
    steps: keep's compiled pass leaves the same slots, ends and positions and lists the same moves."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        rows = int(rng.integers(1, 5))
        lengths = rng.integers(1, 6, size=rows) if trial % 2 else np.full(rows, 4)
        width = int(lengths.max())
        visible = np.zeros((rows, width), dtype=bool)
        for row, length in enumerate(lengths):
            visible[row, width - length :] = True
        slots = RowSlots(visible, np.maximum(np.cumsum(visible, axis=1) - 1, 0))
        for _ in range(4):
            tree_width = int(rng.integers(1, 6))
            slots.open(slots.next_pos[:, None] + np.arange(tree_width)[None, :])
            nodes = []
            for _ in range(rows):
                depth = int(rng.integers(0, tree_width))
                path = np.sort(rng.choice(np.arange(1, tree_width), size=depth, replace=False)) if depth else []
                nodes.append(np.concatenate([[0], path]).astype(np.int64))
            dense, want_visible, want_pos, ends, next_pos, moves = reference_keep(slots, nodes)
            got = slots.keep(nodes)
            assert list(zip(*(part.tolist() for part in got))) == moves
            assert slots.ends.tolist() == ends.tolist() and slots.next_pos.tolist() == next_pos.tolist()
            assert slots.dense == dense and slots.length == int(ends.max())
            if not dense:
                assert np.array_equal(slots.visible, want_visible) and np.array_equal(slots.slot_pos, want_pos)
