"""On CPU, reductions over logits rows run as host arrays; they choose exactly what torch's ops choose."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval_draft.decode.verify import argmax_rows
from retrieval_draft.drafters.recycling import RecyclingDrafter
from retrieval_draft.drafters.row_top_k import top_k_rows
from retrieval_draft.model import transfer


def every(*parts: torch.Tensor) -> list[np.ndarray]:
    """Every row of each part: the nodes argument of ``tree_request`` that observes all of them."""
    return [np.arange(part.shape[0]) for part in parts]


def _rows(seed: int, ties: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(6, 4099, generator=generator)
    if ties:  # coarse values: many exact ties, the largest among them
        rows = torch.round(rows * 2) / 2
    rows[2, 17] = float("inf")
    rows[3, :] = -float("inf")
    return rows


@pytest.mark.parametrize("ties", [False, True])
def test_host_argmax_picks_torchs_index_ties_included(ties):
    rows = _rows(0, ties)
    assert torch.equal(argmax_rows(rows), rows.argmax(dim=-1))


@pytest.mark.parametrize("ties", [False, True])
def test_host_top_k_holds_the_k_largest_values_largest_first_lower_index_on_ties(ties):
    rows = _rows(1, ties)[[0, 1, 4, 5]]  # finite rows (the +inf row's normaliser is not finite)
    ids, values, log_norm = top_k_rows(rows.numpy(), 4)
    expected = torch.topk(rows, 4, dim=-1).values.numpy()
    np.testing.assert_array_equal(values, expected)
    np.testing.assert_array_equal(np.take_along_axis(rows.numpy(), ids, axis=1), values)
    np.testing.assert_allclose(log_norm, torch.logsumexp(rows.double(), dim=-1).numpy(), rtol=1e-6)
    for row, chosen in zip(rows.numpy(), ids):
        order = np.lexsort((np.arange(row.shape[0]), -row))[:4]  # by value, then lower index
        np.testing.assert_array_equal(chosen, order)


def test_recycling_records_the_models_top_k_probabilities_on_the_host_path():
    rows = torch.randn(5, 300, generator=torch.Generator().manual_seed(2)) * 3
    columns = RecyclingDrafter(300, k=4).tree_request([rows], every(rows)).numpy()
    probs = torch.softmax(rows, dim=-1)
    top = torch.topk(probs, 4, dim=-1)
    np.testing.assert_array_equal(columns[:, :4], top.indices.numpy())
    np.testing.assert_allclose(columns[:, 4:].view(np.float32), top.values.numpy(), rtol=1e-5)


@pytest.mark.parametrize("width", [3, 64, 100, 4099])
def test_host_top_k_finds_the_largest_entries_whatever_the_width_and_where_they_lie(width):
    generator = torch.Generator().manual_seed(width)
    rows = torch.randn(3, width, generator=generator)
    rows[1, -1] = 50.0  # in the last, partial block
    rows[2, :] = 1.0  # all tied
    k = min(4, width)
    ids, values, _ = top_k_rows(rows.numpy(), k)
    for row, chosen in zip(rows.numpy(), ids):
        np.testing.assert_array_equal(chosen, np.lexsort((np.arange(width), -row))[:k])


def test_recycling_records_no_id_past_the_vocabulary_for_a_row_of_nan():
    rows = torch.randn(3, 300, generator=torch.Generator().manual_seed(3))
    rows[1] = float("nan")
    drafter = RecyclingDrafter(300, k=4)
    drafter.tree_receive(np.array([5, 6, 7]), drafter.tree_request([rows], every(rows)).numpy())
    assert drafter.successors.max() < 300 and int(drafter.successors[6, 0]) == -1  # EMPTY
    assert drafter.propose(np.array([6]), 4) == []


def test_a_request_over_several_trees_equals_the_request_over_their_rows_joined():
    rows = torch.randn(7, 300, generator=torch.Generator().manual_seed(4)) * 3
    drafter = RecyclingDrafter(300, k=4)
    pieces = [rows[:2], rows[2:3], rows[3:]]
    parts = drafter.tree_request(pieces, every(*pieces)).numpy()
    np.testing.assert_array_equal(parts, drafter.tree_request([rows], every(rows)).numpy())
    ids, values, log_norm = top_k_rows([rows[:4].numpy(), rows[4:].numpy()], 4)
    joined = top_k_rows(rows.numpy(), 4)
    for got, expected in zip((ids, values, log_norm), joined):
        np.testing.assert_array_equal(got, expected)


def test_host_top_k_passes_over_scattered_nan_entries():
    generator = torch.Generator().manual_seed(5)
    rows = torch.randn(5, 4099, generator=generator) * 3
    stride = 4099 // 64
    rows[0, 0] = float("nan")  # a group's first entry
    rows[1, 7 + 1 * stride] = 40.0  # a group's largest entry ...
    rows[1, 7 + 3 * stride] = float("nan")  # ... before a NaN in the same group
    rows[2, ::3] = float("nan")
    rows[3, -1] = float("nan")  # in the last, partial group
    ids, _, _ = top_k_rows(rows.numpy(), 4)
    for row, chosen in zip(rows.numpy(), ids):
        finite = np.where(np.isnan(row), -np.inf, row)
        np.testing.assert_array_equal(chosen, np.lexsort((np.arange(row.shape[0]), -finite))[:4])


@pytest.mark.parametrize("on_host", [True, False])
def test_a_request_for_some_rows_equals_the_full_requests_rows(on_host, monkeypatch):
    rows = torch.randn(9, 300, generator=torch.Generator().manual_seed(6)) * 3
    if not on_host:  # torch's ops, as on a GPU
        monkeypatch.setattr(transfer, "computes_on_host", lambda _: False)
    drafter = RecyclingDrafter(300, k=4)
    first, second = rows[:5], rows[5:]
    chosen = [np.array([0, 2, 4]), np.array([1])]
    full = drafter.tree_request([first, second], every(first, second)).numpy()
    got = drafter.tree_request([first, second], chosen).numpy()
    np.testing.assert_array_equal(got[:, :4], full[[0, 2, 4, 6], :4])
    np.testing.assert_allclose(got[:, 4:].view(np.float32), full[[0, 2, 4, 6], 4:].view(np.float32), rtol=1e-5)
    ids, values, log_norm = top_k_rows([first.numpy(), second.numpy()], 4, chosen)
    all_ids, all_values, all_norms = top_k_rows(rows.numpy(), 4)
    np.testing.assert_array_equal(ids, all_ids[[0, 2, 4, 6]])
    np.testing.assert_array_equal(values, all_values[[0, 2, 4, 6]])
    np.testing.assert_array_equal(log_norm, all_norms[[0, 2, 4, 6]])
