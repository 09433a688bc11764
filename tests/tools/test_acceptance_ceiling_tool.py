"""tools.diagnostics.acceptance_ceiling's replay: ideal step counting with the plugin's lookup and recycling drafters."""

import numpy as np

from retrieval_draft.drafters.recycling import RecyclingDrafter
from tools.diagnostics.acceptance_ceiling import ceilings, replay


def test_replay_counts_steps_as_ideal_verification_would():
    # prompt [1, 2, 3], output repeats it: lookup drafts [1, 2, 3] after the first 1
    tokens = np.array([1, 2, 3, 1, 2, 3, 1])
    top_ids = np.zeros((7, 4), dtype=np.int64)
    top_probs = np.zeros((7, 4))
    steps, emitted, misses = replay(tokens, 3, top_ids, top_probs, use_lookup=True, recycled=None)
    # step 1: after 3 nothing recurs -> emits 1 (a first miss); step 2: [2, 3, 1] all accepted + bonus past the end
    assert (steps, emitted, misses) == (2, 4, 1)
    steps, emitted, misses = replay(tokens, 3, top_ids, top_probs, use_lookup=False, recycled=None)
    assert (steps, emitted, misses) == (4, 4, 4)  # no drafts: one token per step


def test_replay_records_verified_positions_into_the_table_for_later_steps():
    tokens = np.array([5, 6, 5, 6, 5, 6])
    top_ids = np.array([[6, 0], [5, 0], [6, 0], [5, 0], [6, 0], [5, 0]])
    top_probs = np.full((6, 2), 0.5)
    table = RecyclingDrafter(vocab_size=7, k=2, max_nodes=4)
    steps, emitted, _ = replay(tokens, 1, top_ids, top_probs, use_lookup=False, recycled=table)
    # step 1 (after 5): empty table -> 1 token; then 6 -> 5 is known, 5 -> 6 recorded at position 0 ...
    assert emitted == 5 and steps < 5
    assert table.successors[5].tolist() == [6, 0] and table.successors[6].tolist() == [5, 0]


def test_ceilings_average_workloads_and_include_the_measured_plugin_figure():
    record = {"workload": "w", "prompt_len": 3, "tokens": np.array([1, 2, 3, 1, 2, 3, 1]), "plugin": (3, 2),
              "top_ids": np.zeros((7, 8), dtype=np.int64), "top_probs": np.zeros((7, 8))}
    table = ceilings([record, dict(record, workload="v", plugin=(5, 2))])
    assert table["w"]["lookup"] == 2.0 and table["w"]["first miss, lookup"] == 0.5
    assert table["mean of workloads"]["plugin (measured)"] == 2.0
