"""tools.acceptance_ceiling's replay: lookup drafts, the recycled table and ideal step counting."""

import numpy as np

from tools.acceptance_ceiling import RecycledTable, ceilings, lookup_draft, replay


def test_lookup_draft_continues_the_latest_occurrence_of_the_longest_suffix():
    tokens = np.array([1, 2, 3, 9, 2, 3, 7, 8, 5, 2, 3])
    # suffix [2, 3] last occurred at 4..5, followed by 7, 8, 5, 2, 3 (never past the end)
    assert lookup_draft(tokens, len(tokens)).tolist() == [7, 8, 5, 2, 3]
    assert lookup_draft(tokens, len(tokens), max_len=2).tolist() == [7, 8]
    assert lookup_draft(np.array([4, 5, 6]), 3).tolist() == []


def test_recycled_tree_grows_best_first_from_the_recorded_successors():
    table = RecycledTable(k=2)
    table.record(1, np.array([2, 3, 4]), np.array([0.6, 0.3, 0.1]))
    table.record(2, np.array([5, 6]), np.array([0.9, 0.1]))
    assert table.rows[1][0].tolist() == [2, 3]  # k=2 keeps two successors
    # (2,) 0.6, (2, 5) 0.54, (3,) 0.3, (2, 6) 0.06
    assert table.tree(1, nodes=3) == [(2,), (2, 5), (3,)]
    assert table.tree(7, nodes=3) == []


def test_replay_counts_steps_as_ideal_verification_would():
    # prompt [1, 2, 3], output repeats it: lookup drafts [1, 2, 3] after the first 1
    tokens = np.array([1, 2, 3, 1, 2, 3, 1])
    top_ids = np.zeros((7, 4), dtype=np.int64)
    top_probs = np.zeros((7, 4))
    steps, emitted, misses = replay(tokens, 3, top_ids, top_probs, use_lookup=True, table=None, nodes=0)
    # step 1: after 3 nothing recurs -> emits 1 (a first miss); step 2: [2, 3, 1] all accepted + bonus past the end
    assert (steps, emitted, misses) == (2, 4, 1)
    steps, emitted, misses = replay(tokens, 3, top_ids, top_probs, use_lookup=False, table=None, nodes=0)
    assert (steps, emitted, misses) == (4, 4, 4)  # no drafts: one token per step


def test_replay_records_verified_positions_into_the_table_for_later_steps():
    tokens = np.array([5, 6, 5, 6, 5, 6])
    top_ids = np.array([[6, 0], [5, 0], [6, 0], [5, 0], [6, 0], [5, 0]])
    top_probs = np.full((6, 2), 0.5)
    table = RecycledTable(k=2)
    steps, emitted, _ = replay(tokens, 1, top_ids, top_probs, use_lookup=False, table=table, nodes=4)
    # step 1 (after 5): empty table -> 1 token; then 6 -> 5 is known, 5 -> 6 recorded at position 0 ...
    assert emitted == 5 and steps < 5
    assert table.rows[5][0].tolist() == [6, 0] and table.rows[6][0].tolist() == [5, 0]


def test_ceilings_average_workloads_and_include_the_measured_plugin_figure():
    record = {"workload": "w", "prompt_len": 3, "tokens": np.array([1, 2, 3, 1, 2, 3, 1]), "plugin": (3, 2),
              "top_ids": np.zeros((7, 8), dtype=np.int64), "top_probs": np.zeros((7, 8))}
    table = ceilings([record, dict(record, workload="v", plugin=(5, 2))])
    assert table["w"]["lookup"] == 2.0 and table["w"]["first miss, lookup"] == 0.5
    assert table["mean of workloads"]["plugin (measured)"] == 2.0
