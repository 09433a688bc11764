"""Logits recycling: draft from what earlier verification forwards already computed.

Every tree forward gives the model's next-token distribution at every node.
Instead of throwing it away, ``RecyclingDrafter`` keeps, per token id, the
top-k tokens the model last predicted after it, with their probabilities
(read at each tree's ``max_observed_nodes`` likeliest nodes):
a (vocab x k) adjacency table, first-order in the token but filled by the
full model in real contexts (the idea behind Token Recycling). Drafting
expands a small tree from the context's last token, best first by the
product of recorded probabilities. It needs no corpus and drafts wherever
retrieval finds nothing: new code, open chat.

Memory: ``vocab_size * k`` int32 ids plus as many float32 probabilities,
1.5 MB for a 49,152-token vocabulary at k=4. The table survives restarts
with ``save`` and ``load``: one ``.npz`` holding both arrays, a format version
and the tokenizer's fingerprint, written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numba
import numpy as np

from retrieval_draft.draft import Drafter, Proposals
from retrieval_draft.drafters.row_top_k import top_k_rows
from retrieval_draft.model import transfer
from retrieval_draft.drafters.tagged_npz import load_tagged, save_tagged
from retrieval_draft.errors import CorruptRecyclingTableError, InvalidInputError

if TYPE_CHECKING:
    import torch

RECYCLING_FORMAT = 1
EMPTY = -1  # id slot never filled


class RecyclingDrafter(Drafter):
    """Drafts a best-first tree from the model's recorded top-k successors of each token.

    Args:
        vocab_size: rows of the table (the model's vocabulary).
        k: successors kept per token.
        max_nodes: most draft nodes proposed per step (the planner prunes further).
    """

    name = "recycle"
    # The recorded probabilities are the model's own, but from another context
    # that shares only the last token: start sceptical, calibration corrects it.
    prior_scale = 0.5
    observes_trees = True
    # A tree's likeliest nodes only: each row costs a pass over the vocabulary (~50 us on a
    # 2-core CPU at V = 49,152), and a chain replayed from the output history has 14-27.
    max_observed_nodes = 8

    def __init__(self, vocab_size: int, k: int = 4, max_nodes: int = 16) -> None:
        if vocab_size < 1 or k < 1 or max_nodes < 1:
            raise InvalidInputError(f"vocab_size, k and max_nodes must be >= 1, got {vocab_size}, {k}, {max_nodes}")
        self.vocab_size = vocab_size
        self.k = k
        self.max_nodes = max_nodes
        self.successors = np.full((vocab_size, k), EMPTY, dtype=np.int32)
        self.probs = np.zeros((vocab_size, k), dtype=np.float32)

    @property
    def filled(self) -> int:
        """Tokens whose successors have been recorded."""
        return int(np.count_nonzero(self.successors[:, 0] != EMPTY))

    def tree_request(self, logits: "Sequence[torch.Tensor]", nodes: "Sequence[np.ndarray]") -> "torch.Tensor":
        """The top-k of the rows ``nodes[i]`` of every ``logits[i]`` (shape (n_i, V), raw), on
        their device: shape (sum m_i, 2k), int32, the k token ids then the k probabilities'
        float32 bit patterns."""
        import torch

        with torch.no_grad():
            if transfer.computes_on_host(logits[0]):  # torch.topk and logsumexp cost ~4x more on CPU (row_top_k)
                return torch.from_numpy(self._host_request([part.numpy() for part in logits], nodes))
            picked = [part if len(chosen) == part.shape[0] else
                      part[torch.from_numpy(chosen).to(part.device, non_blocking=True)]
                      for part, chosen in zip(logits, nodes)]
            rows = (picked[0] if len(picked) == 1 else torch.cat(picked))[:, : self.vocab_size].float()
            top = torch.topk(rows, self.k, dim=-1)
            indices = top.indices
            probs = torch.exp(top.values - torch.logsumexp(rows, dim=-1, keepdim=True))
        return torch.cat([indices.to(torch.int32), probs.view(torch.int32)], dim=1)

    def _host_request(self, parts: "Sequence[np.ndarray]", nodes: "Sequence[np.ndarray]") -> np.ndarray:
        """``tree_request``'s columns computed on the host from the rows ``nodes[i]`` of each
        part's (n_i, V) float32 logits, without joining or copying them: (sum m_i, 2k) int32."""
        width = min(parts[0].shape[1], self.vocab_size)
        ids, values, log_norm = top_k_rows([part[:, :width] for part in parts], self.k, nodes)
        columns = np.empty((ids.shape[0], 2 * self.k), dtype=np.int32)
        _fill_columns(ids, values, log_norm, width, columns, columns.view(np.float32))
        return columns

    def tree_receive(self, tokens: np.ndarray, columns: np.ndarray) -> None:
        """Record ``tree_request``'s columns (shape (m, 2k), host) as the successors of
        ``tokens`` (shape (m,), the node tokens those rows were computed at)."""
        self.successors[tokens] = columns[:, : self.k]
        self.probs[tokens] = columns[:, self.k :].view(np.float32)

    def propose_into(self, context: np.ndarray, max_len: int, out: Proposals) -> None:
        """One draft per leaf of the best-first tree grown from ``context[-1]``."""
        root = int(context[-1])
        if max_len < 1 or root >= self.vocab_size or self.successors[root, 0] == EMPTY:
            return
        out.add_flat(*_best_first_leaves(self.successors, self.probs, root, self.max_nodes, max_len))

    def save(self, path: str | Path, tokenizer=None) -> None:
        """Write the table to ``path`` (.npz) atomically; with ``tokenizer``, record its fingerprint."""
        save_tagged(path, {"successors": self.successors, "probs": self.probs}, RECYCLING_FORMAT, tokenizer)

    @classmethod
    def load(cls, path: str | Path, *, vocab_size: int, tokenizer=None, max_nodes: int = 16) -> "RecyclingDrafter":
        """A drafter holding the table saved at ``path``.

        Raises CorruptRecyclingTableError for an unreadable or malformed file (ids out
        of range included) or one recorded for another vocabulary size,
        TokenizerMismatchError when ``tokenizer`` differs from the one recorded.
        """
        arrays = load_tagged(path, ("successors", "probs"), RECYCLING_FORMAT, CorruptRecyclingTableError,
                             "recycling table", tokenizer)
        successors, probs = arrays["successors"], arrays["probs"]
        shape_ok = successors.ndim == 2 and successors.shape == probs.shape and successors.shape[1] >= 1
        if not shape_ok or successors.dtype != np.int32 or probs.dtype != np.float32:
            raise CorruptRecyclingTableError(f"{path} does not hold an (n, k) int32 table with float32 probabilities")
        if successors.shape[0] != vocab_size:
            raise CorruptRecyclingTableError(f"{path} was recorded for {successors.shape[0]} token ids, not {vocab_size}")
        if int(successors.min()) < EMPTY or int(successors.max()) >= vocab_size:
            raise CorruptRecyclingTableError(f"{path} holds successor ids outside [0, {vocab_size})")
        if not (np.all(np.isfinite(probs)) and np.all(probs >= 0) and np.all(probs <= 1)):
            raise CorruptRecyclingTableError(f"{path} holds probabilities outside [0, 1]")
        drafter = cls(vocab_size, k=successors.shape[1], max_nodes=max_nodes)
        drafter.successors, drafter.probs = successors.copy(), probs.copy()
        return drafter


@numba.njit(cache=True, nogil=True)
def _fill_columns(ids, values, log_norm, width, columns, bits):  # pragma: no cover - compiled
    """``top_k_rows``' output (ids, values (m, k), log_norm (m,)) as the table's columns
    ``columns`` (m, 2k) int32: the k ids, EMPTY where a NaN row left a slot unfilled (id
    ``width``), then the k probabilities, written through ``bits``, the same memory as float32,
    0 where not finite (a row of NaN)."""
    k = ids.shape[1]
    for r in range(ids.shape[0]):
        for j in range(k):
            columns[r, j] = ids[r, j] if ids[r, j] < width else EMPTY
            prob = np.exp(np.float64(values[r, j]) - log_norm[r])
            bits[r, k + j] = prob if np.isfinite(prob) else 0.0


@numba.njit(cache=True, nogil=True)
def _push_children(successors, probs, node, token, path, frontier_key, frontier_ints, frontier_cond, pushed):  # pragma: no cover - compiled
    """Add the recorded successors of ``token`` (at tree node ``node``, path probability ``path``)
    to the frontier from slot ``pushed`` on, stopping at an empty slot; returns the new end."""
    for j in range(successors.shape[1]):
        successor = successors[token, j]
        prob = np.float64(probs[token, j])
        if successor == EMPTY or prob <= 0.0:
            break
        frontier_key[pushed] = -(path * prob)
        frontier_ints[pushed, 0], frontier_ints[pushed, 1] = node, successor
        frontier_cond[pushed] = min(prob, 1.0)
        pushed += 1
    return pushed


@numba.njit(cache=True, nogil=True)
def _best_first_leaves(successors, probs, root, max_nodes, max_len):  # pragma: no cover - compiled
    """The best-first tree from ``root`` over the table (``successors``/``probs`` (V, k)): up to
    ``max_nodes`` draft nodes, each time the frontier entry of highest path probability (ties: the
    lower parent node, then the lower token id, then the lower conditional), children no deeper
    than ``max_len``. Returns its root-to-leaf paths laid end to end, leaves in node order: tokens
    (m,) int64, conditional probabilities (m,) float64 (each capped at 1), path lengths (d,) int64."""
    cap = (max_nodes + 1) * successors.shape[1]
    frontier_key = np.empty(cap, np.float64)  # minus the path probability
    frontier_ints = np.empty((cap, 2), np.int64)  # parent node, token
    frontier_cond = np.empty(cap, np.float64)
    taken = np.zeros(cap, np.bool_)
    tokens = np.empty(max_nodes + 1, np.int64)
    parents = np.empty(max_nodes + 1, np.int64)
    conditional = np.empty(max_nodes + 1, np.float64)
    depths = np.zeros(max_nodes + 1, np.int64)
    has_child = np.zeros(max_nodes + 1, np.bool_)
    tokens[0], parents[0], conditional[0] = root, -1, 1.0
    count = 1
    first = np.int64(0)  # typed, not a literal: one compiled _push_children serves every call
    pushed = _push_children(successors, probs, first, root, 1.0, frontier_key, frontier_ints, frontier_cond, first)
    popped = 0
    while popped < pushed and count <= max_nodes:
        best = -1
        for i in range(pushed):  # the smallest (key, parent, token, conditional) not taken
            if taken[i]:
                continue
            if best < 0:
                best = i
            elif frontier_key[i] != frontier_key[best]:
                if frontier_key[i] < frontier_key[best]:
                    best = i
            elif frontier_ints[i, 0] != frontier_ints[best, 0]:
                if frontier_ints[i, 0] < frontier_ints[best, 0]:
                    best = i
            elif frontier_ints[i, 1] != frontier_ints[best, 1]:
                if frontier_ints[i, 1] < frontier_ints[best, 1]:
                    best = i
            elif frontier_cond[i] < frontier_cond[best]:
                best = i
        taken[best] = True
        popped += 1
        node = count
        parent = frontier_ints[best, 0]
        tokens[node], parents[node], conditional[node] = frontier_ints[best, 1], parent, frontier_cond[best]
        depths[node] = depths[parent] + 1
        has_child[parent] = True
        count += 1
        if depths[node] < max_len:
            pushed = _push_children(successors, probs, np.int64(node), tokens[node], -frontier_key[best], frontier_key,
                                    frontier_ints, frontier_cond, pushed)
    leaves = 0
    total = 0
    for leaf in range(1, count):
        if not has_child[leaf]:
            leaves += 1
            total += depths[leaf]
    out_tokens = np.empty(total, np.int64)
    out_probs = np.empty(total, np.float64)
    lengths = np.empty(leaves, np.int64)
    at = 0
    d = 0
    for leaf in range(1, count):
        if has_child[leaf]:
            continue
        cursor = leaf
        for i in range(depths[leaf] - 1, -1, -1):
            out_tokens[at + i] = tokens[cursor]
            out_probs[at + i] = conditional[cursor]
            cursor = parents[cursor]
        lengths[d] = depths[leaf]
        at += depths[leaf]
        d += 1
    return out_tokens, out_probs, lengths
