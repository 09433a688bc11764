"""Token trees: drafts merged into one trie, pruned to a node budget.

Node 0 is the root: the pending token, already chosen and emitted, whose KV
row is not yet in the cache. Every other node is a draft token. Nodes are in
topological order (a parent's index is below its children's); ``children``
lists each node's children by decreasing estimated probability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from retrieval_draft.draft import EMPTY_INT64, Draft, Proposals


@dataclass(frozen=True)
class DraftTree:
    """A validated token tree.

    Attributes:
        tokens: shape (n,), int64 token id of each node; ``tokens[0]`` is the root.
        parents: shape (n,), int64 parent index; ``parents[0] == -1``.
        depths: shape (n,), int64 distance from the root (root 0).
        probs: shape (n,), float64 estimated probability that the node is
            accepted (root 1.0), never above its parent's.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if n < 1 or self.parents[0] != -1 or self.depths[0] != 0:
            raise ValueError("a DraftTree needs a root at index 0")
        for name in ("parents", "depths", "probs"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"DraftTree.{name} must have shape ({n},)")
        if n > 1:
            child_parents = self.parents[1:]
            if child_parents.min() < 0 or (child_parents >= np.arange(1, n)).any():
                raise ValueError("DraftTree nodes must be in topological order")
            if (self.depths[1:] != self.depths[child_parents] + 1).any():
                raise ValueError("DraftTree depths disagree with parents")

    @classmethod
    def built(cls, tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, probs: np.ndarray) -> "DraftTree":
        """A tree that this package's own merge, cap or prune just built (valid by construction),
        made without re-checking it: decoding builds three per row and step."""
        tree = object.__new__(cls)
        for name, value in (("tokens", tokens), ("parents", parents), ("depths", depths), ("probs", probs)):
            object.__setattr__(tree, name, value)
        return tree

    @property
    def size(self) -> int:
        """Number of nodes, root included."""
        return int(self.tokens.shape[0])

    def children(self) -> list[list[int]]:
        """Child indices of every node, by decreasing estimated probability."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for child in self.ranked():
            kids[int(self.parents[child])].append(int(child))
        return kids

    def ranked(self) -> np.ndarray:
        """The draft nodes' indices, shape (n - 1,) int64, by decreasing ``probs`` (ties to the lower index)."""
        if self.size == 1:  # a lone root (most rows of a fresh batch): nothing to sort
            return EMPTY_INT64
        return np.argsort(-self.probs[1:], kind="stable") + 1

    def ancestor_mask(self) -> np.ndarray:
        """Boolean (n, n): ``[i, j]`` is True when node j is node i or one of its ancestors (the
        ``among`` block of ``pack_into`` at the tree's own width)."""
        n = self.size
        tokens, depths, mask = np.empty(n, np.int64), np.empty(n, np.int64), np.empty((n, n), np.bool_)
        self.pack_into(tokens, depths, mask)
        return mask

    def pack_into(self, tokens: np.ndarray, depths: np.ndarray, among: np.ndarray) -> None:
        """Write the tree as one row of a step's inputs, W >= n slots wide, in one compiled pass:
        ``tokens`` (W,) int64 ids (slots past the tree hold the root's), ``depths`` (W,) int64
        (0 past the tree) and ``among`` (W, W) bool, which slots each slot sees: a node itself and
        its ancestors (``ancestor_mask``), a slot past the tree only itself."""
        _pack_row(self.tokens, self.parents, self.depths, tokens, depths, among)

    def top(self, budget: int, scores: np.ndarray) -> "DraftTree":
        """The root plus the ``budget`` draft nodes of highest ``scores`` (shape (n,)).

        ``scores`` must never rise from parent to child (probabilities of
        reaching a node do not), so with ties broken by index the kept set
        holds every kept node's ancestors.
        """
        if budget + 1 >= self.size:
            return self
        return self.kept(np.argsort(-scores[1:], kind="stable")[:budget] + 1)

    def likeliest(self, count: int | None) -> np.ndarray:
        """Indices, ascending, shape (min(count, n),) int64, of the ``count`` nodes of highest
        ``probs`` (ties to the lower index, so the root, at 1.0, is always one); every node when
        ``count`` is None or covers the tree."""
        if count is None or count >= self.size:
            return np.arange(self.size)
        return np.sort(np.argsort(-self.probs, kind="stable")[:count])

    def kept(self, nodes: np.ndarray) -> "DraftTree":
        """The root plus draft ``nodes`` (shape (k,), any order), which must hold each one's
        ancestors (``top``'s choice does)."""
        keep = np.concatenate([[0], np.sort(nodes)])
        remap = np.full(self.size, -1, dtype=np.int64)
        remap[keep] = np.arange(keep.shape[0])
        parents = self.parents[keep]
        return DraftTree.built(
            tokens=self.tokens[keep],
            parents=np.where(parents >= 0, remap[np.maximum(parents, 0)], -1),
            depths=self.depths[keep],
            probs=self.probs[keep],
        )

    def best_chain(self) -> "DraftTree":
        """The tree's most probable root-to-leaf path as a tree of its own: from the root, the
        child of highest ``probs`` at each step (ties to the lower index). Returns ``self``
        when the tree already is a chain."""
        if np.all(self.parents[1:] == np.arange(self.size - 1)):
            return self
        kids = self.children()
        path = [0]
        while kids[path[-1]]:
            path.append(kids[path[-1]][0])
        keep = np.asarray(path, dtype=np.int64)
        return DraftTree(
            tokens=self.tokens[keep],
            parents=np.arange(-1, keep.shape[0] - 1, dtype=np.int64),
            depths=self.depths[keep],
            probs=self.probs[keep],
        )

    def path_to(self, node: int) -> np.ndarray:
        """Node indices from the root's first child down to ``node`` (root excluded)."""
        path = []
        while node > 0:
            path.append(node)
            node = int(self.parents[node])
        return np.array(path[::-1], dtype=np.int64)


def build_tree(root_token: int, drafts: list[Draft], budget: int) -> DraftTree:
    """Merge ``Draft`` values under ``root_token`` and keep the ``budget`` most probable draft
    nodes (decoding merges its ``Proposals`` with ``merge_flat``)."""
    tree = merge_drafts(root_token, drafts)
    return tree.top(budget, tree.probs)


def merge_drafts(root_token: int, drafts: list[Draft]) -> DraftTree:
    """Merge ``drafts`` into one trie under ``root_token``, unpruned.

    A node proposed by several drafts gets the largest of their path
    probabilities (drafts sharing a prefix are rarely independent evidence:
    a drafter's own branches share theirs by construction), which keeps every
    child at or below its parent. Nodes are numbered in the order drafts first
    reach them (one compiled pass over the drafts' tokens, ``_merge``).
    """
    return merge_flat(root_token, *Proposals.of([("", draft) for draft in drafts]).flat())


def merge_flat(root_token: int, tokens: np.ndarray, probs: np.ndarray, lengths: np.ndarray) -> DraftTree:
    """``merge_drafts`` of drafts laid end to end: ``tokens`` (m,) ids and ``probs`` (m,)
    conditional probabilities, draft i being the next ``lengths[i]`` (d,) entries."""
    if not tokens.size:
        return lone_root(root_token)
    return DraftTree.built(*_merge(int(root_token), tokens.astype(np.int64, copy=False),
                             probs.astype(np.float64, copy=False), lengths.astype(np.int64, copy=False)))


def lone_root(root_token: int) -> DraftTree:
    """The tree of the pending token alone (no drafts): most rows of a fresh batch, every step.
    Its parents, depths and probabilities are shared read-only arrays."""
    return DraftTree.built(np.array([root_token], np.int64), _ROOT_PARENTS, _ROOT_DEPTHS, _ROOT_PROBS)


_ROOT_PARENTS, _ROOT_DEPTHS, _ROOT_PROBS = np.array([-1], np.int64), np.zeros(1, np.int64), np.ones(1)
_ROOT_PARENTS.flags.writeable = _ROOT_DEPTHS.flags.writeable = _ROOT_PROBS.flags.writeable = False


@numba.njit(cache=True, nogil=True)
def _pack_row(tree_tokens, parents, tree_depths, tokens, depths, among) -> None:  # pragma: no cover - compiled
    """``DraftTree.pack_into``: a tree of n nodes into one row W >= n slots wide."""
    n, width = tree_tokens.shape[0], tokens.shape[0]
    for i in range(width):
        for j in range(width):
            among[i, j] = False
        among[i, i] = True
        tokens[i] = tree_tokens[i] if i < n else tree_tokens[0]
        depths[i] = tree_depths[i] if i < n else 0
    for node in range(1, n):  # topological order: a parent's row is complete before its children's
        parent = parents[node]
        for j in range(node):  # a loop, not a slice copy: Numba compiles slicing in ~1.5 s, this in 0.1
            among[node, j] = among[parent, j]


@numba.njit(cache=True, nogil=True)
def _merge(root: int, tokens: np.ndarray, probs: np.ndarray, lengths: np.ndarray):
    """The trie of the drafts laid end to end in ``tokens`` / ``probs`` (m,), draft i being the
    next ``lengths[i]`` entries: its (tokens, parents, depths, best path probability), each (n,)."""
    size = tokens.shape[0] + 1
    out_tokens = np.empty(size, np.int64)
    parents = np.empty(size, np.int64)
    depths = np.empty(size, np.int64)
    best = np.zeros(size, np.float64)
    first_child = np.full(size, -1, np.int64)
    next_sibling = np.full(size, -1, np.int64)
    out_tokens[0], parents[0], depths[0], best[0] = root, -1, 0, 1.0
    n, i = 1, 0
    for d in range(lengths.shape[0]):
        node, path = 0, 1.0
        for _ in range(lengths[d]):
            token = tokens[i]
            path *= probs[i]
            i += 1
            child, last = first_child[node], -1
            while child != -1 and out_tokens[child] != token:
                last, child = child, next_sibling[child]
            if child == -1:
                child = n
                n += 1
                out_tokens[child], parents[child], depths[child] = token, node, depths[node] + 1
                if last == -1:
                    first_child[node] = child
                else:
                    next_sibling[last] = child
            if path > best[child]:
                best[child] = path
            node = child
    return out_tokens[:n].copy(), parents[:n].copy(), depths[:n].copy(), best[:n].copy()
