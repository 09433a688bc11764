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
