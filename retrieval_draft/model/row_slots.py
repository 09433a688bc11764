"""Which KV-cache slot holds which token, per batch row: the host side of ``TreeModel``'s cache.

The cache has shape (B, H_kv, T, d) per layer: every row's slots 0..L-1 hold
its (left-padded) prompt, then its kept tokens, then a gap up to T, the common
length. Rows accept different numbers of tokens per step, so the gap differs
by row; it is never copied, only hidden by the mask. ``RowSlots`` keeps:

- ``visible`` (B, T) bool: which slots a row's new tokens attend to (its
  real prompt tokens and kept tokens; never padding, gaps or rejected nodes);
- ``slot_pos`` (B, T) int64: the position id of each slot (sliding windows);
- ``ends`` (B,): the slot after each row's last kept token; ``next_pos`` (B,):
  the position id of each row's next token (its real tokens so far);
- ``length``: T, the slots in use (the longest row's end).

While every slot is visible (one unpadded row, or rows of equal length that
accepted alike), slot j holds position j in every row: the slots are
``dense``, and ``visible`` / ``slot_pos`` are neither read nor extended, so a
step's host work does not grow with the cache. They are written out when rows
first accept unlike, and go unread again once the rows left see every slot.
"""

from __future__ import annotations

import numba
import numpy as np

# What ``_kept`` is given for ``visible`` / ``slot_pos`` while the slots are dense (it writes neither).
_NO_MASK = np.zeros((0, 0), dtype=bool)
_NO_POSITIONS = np.zeros((0, 0), dtype=np.int64)


class RowSlots:
    """Slot bookkeeping of B rows.

    Args:
        visible: (B, T) bool, the slots each row sees after its prefill.
        slot_pos: (B, T) int64, their position ids.

    Each row ends after its last visible slot.
    """

    def __init__(self, visible: np.ndarray, slot_pos: np.ndarray) -> None:
        rows, length = visible.shape
        self.visible, self.slot_pos, self.length = visible, slot_pos, int(length)
        last = length - np.argmax(visible[:, ::-1], axis=1) if length else np.zeros(rows, dtype=np.int64)
        self.ends = np.where(visible.any(axis=1), last, 0).astype(np.int64)
        self.next_pos = visible.sum(axis=1).astype(np.int64)
        self.dense = bool(visible.all())

    @classmethod
    def empty(cls) -> "RowSlots":
        """No rows, no slots (a tree model before its prefill)."""
        return cls(np.zeros((0, 0), dtype=bool), np.zeros((0, 0), dtype=np.int64))

    @property
    def rows(self) -> int:
        """B, the rows kept."""
        return int(self.ends.shape[0])

    def open(self, positions: np.ndarray) -> None:
        """A forward wrote W new slots per row at ``positions`` (B, W): hidden until kept."""
        if not self.dense:
            rows, width = positions.shape
            self.visible = np.concatenate([self.visible, np.zeros((rows, width), dtype=bool)], axis=1)
            self.slot_pos = np.concatenate([self.slot_pos, positions], axis=1)

    def keep(self, nodes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keep, per row, the new slots of tree ``nodes[i]`` (increasing, starting with root 0, a
        path from the root) after that row's kept tokens, and hide the rest; T becomes the longest
        row's end. Every row at once, in one compiled pass (``_kept``): no step's work is a loop
        over rows, nor a dozen small numpy calls.

        Returns the cache moves that takes, each shape (m,) int64: rows, source slots, target
        slots (a dense row's accepted chain is already in place and is not listed).
        """
        base = self.length
        counts = np.fromiter((kept.shape[0] for kept in nodes), dtype=np.int64, count=len(nodes))
        kept = np.concatenate(nodes)
        if self.dense and counts.min() != counts.max():  # rows accepted unlike: gaps appear, write the rows out
            # Every row ends at ``base`` and keeps its tokens from there, so slot j holds position j
            # up to the longest row's end; shorter rows' tails are hidden by ``_kept``.
            length = base + int(counts.max())
            self.visible = np.ones((self.rows, length), dtype=bool)
            self.slot_pos = np.broadcast_to(np.arange(length), (self.rows, length)).copy()
            self.dense = False
        # dense slots: visible / slot_pos are not touched (nor typed: they may be read-only views)
        visible, slot_pos = (_NO_MASK, _NO_POSITIONS) if self.dense else (self.visible, self.slot_pos)
        moves = _kept(counts, np.asarray(kept, dtype=np.int64), base, self.ends, self.next_pos,
                      visible, slot_pos, not self.dense)
        self.truncate(int(self.ends.max()))
        return moves

    def drop(self, row: int) -> None:
        """Remove ``row``: the last row takes its place (T is left as it is)."""
        last = self.rows - 1
        for name in ("ends", "next_pos") if self.dense else ("visible", "slot_pos", "ends", "next_pos"):
            values = getattr(self, name)
            values[row] = values[last]
            setattr(self, name, values[:last])

    def settle(self) -> None:
        """After rows left: T becomes the longest remaining row's end, and slots that every
        remaining row sees make the rows dense again."""
        if self.rows:
            self.truncate(int(self.ends.max()))
            if not self.dense and self.visible.all():
                self.dense = True

    def truncate(self, length: int) -> None:
        """Use only the first ``length`` slots."""
        if not self.dense:
            self.visible, self.slot_pos = self.visible[:, :length], self.slot_pos[:, :length]
        self.length = length


@numba.njit(cache=True, nogil=True)
def _kept(counts, kept, base, ends, next_pos, visible, slot_pos, write_out):  # pragma: no cover - compiled
    """``RowSlots.keep``'s work: row r keeps ``counts[r]`` nodes, the next run of ``kept`` (n,)
    int64 (tree node indices: node j was written at slot ``base + j``), into its slots from
    ``ends[r]`` on. With ``write_out`` (slots not dense) each row's ``visible`` (B, T) is cut at
    its end, its kept slots shown and their ``slot_pos`` (B, T) set from ``next_pos``. ``ends`` and
    ``next_pos`` (B,) advance by ``counts``. Returns the moves (rows, source slots, target slots),
    each (m,) int64, for the kept nodes not already in place."""
    n = kept.shape[0]
    rows, sources, targets = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    m, i = 0, 0
    for r in range(counts.shape[0]):
        if write_out:
            visible[r, ends[r]:] = False
        for j in range(counts[r]):
            target = ends[r] + j
            if write_out:
                visible[r, target] = True
                slot_pos[r, target] = next_pos[r] + j
            if target != base + kept[i]:
                rows[m], sources[m], targets[m] = r, base + kept[i], target
                m += 1
            i += 1
        ends[r] += counts[r]
        next_pos[r] += counts[r]
    return rows[:m].copy(), sources[:m].copy(), targets[:m].copy()
