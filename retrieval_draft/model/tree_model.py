"""The target model's tree forward over B rows (part of ``model``, the only code touching transformers internals).

``TreeModel`` wraps a causal LM and its KV cache: prefill a left-padded batch,
score one token tree per row in ONE forward pass (additive mask + per-node
position ids), keep each row's accepted nodes, and drop rows that finished.
One prompt is a batch of one. Models that cannot take a tree mask
(``attention_layout``) score one chain per row, the tree's best path, with
their own causal masking.

Which cache slot holds which token in each row is ``RowSlots``' job
(``row_slots``): prompts left-padded at slots 0..L-1, kept tokens after them,
a gap per row up to the common length T, hidden by the mask and never copied.
A step writes every row's tree at slots T..T+W-1 (trees padded to a common
width W; dead slots see only the cache and themselves and are never kept),
then ``keep`` moves each row's accepted rows down to its end in place (only
the accepted rows move, never the cache) and shortens T to the longest row.
A finished row leaves the batch: the last row takes its place.

While the slots are dense (every slot visible, slot j at position j: one
unpadded row, or rows of equal length that accepted alike), steps take the
cheap branches of the one path: a lone root per row (or a chain) runs with the
model's own causal mask, as plain decoding does, and a tree's mask is built on
the device.

With ``static`` set (``static_shapes.StaticSteps``, the plugin's ``cache_implementation="static"``)
every step runs at one of a few fixed widths over the whole preallocated pool, through the
model or a compiled call of it; the slots' bookkeeping and the compaction are the same.

A call may start from KV rows known from earlier calls or from a cache the caller
passed (``prefix_cache``): the tree model owns that call's ``PrefixReuse``
(``start_reuse``, ``finish_reuse``), asks it where the known rows go, and runs
the seeded prefill on its own cache (``_seeded_prefill``).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from retrieval_draft.errors import InvalidInputError, UnsupportedModelError, counted
from retrieval_draft.tree import DraftTree
from retrieval_draft.model.attention_layout import CHAIN, attention_layout
from retrieval_draft.model.chain_probe import probe_chain_forward
from retrieval_draft.model.kv_cache import GrowingLayer, KVPool, cut_back, fresh, model_cache, pooled, seeded_cache
from retrieval_draft.model.prefix_cache import (
    PrefixCache, PrefixReuse, ReuseReport, SeededPrefill, layout_blocker, weights_signature,
)
from retrieval_draft.model.row_slots import RowSlots
from retrieval_draft.model.static_shapes import (
    RECOMPILE_LIMIT, StaticSteps, slot_cache, static_capacity, static_inputs,
)
from retrieval_draft.model.skinny_linear import (
    SKINNY_ROWS, KernelThreads, eligible_linears, skinny_forwards, skinny_linears,
)
from retrieval_draft.model.transfer import to_device
from retrieval_draft.model.tree_attention import sdpa_configs, steady_attention, tree_attention

PREFILL_CHUNK = 512  # new tokens per forward of a prefill that starts from known rows (``_seeded_prefill``)
HANDOFF_SLACK = 0.25  # spare pool positions (a share of the rows) up to which a one-row pool is kept, not copied


@dataclass(frozen=True)
class PackedTrees:
    """One step's forward inputs (``TreeModel.pack``).

    Attributes:
        tokens: (B, W) int64 node tokens on the model's device (dead slots repeat the root).
        position_ids: (B, W) int64 position of each slot, on the device.
        mask: the attention mask (``TreeModel._inputs``), or None for the model's own causal mask.
        positions: (B, W) int64, the same positions on the host (the slots' bookkeeping).
        grouped: whether the forward may read grouped KV heads in place (a tree mask applies).
    """

    tokens: torch.Tensor
    position_ids: torch.Tensor
    mask: object
    positions: np.ndarray
    grouped: bool


def context_limit(model: torch.nn.Module) -> int | None:
    """The model's maximum sequence length in tokens, when its config states one."""
    return getattr(model.config, "max_position_embeddings", None)


class TreeModel:
    """A causal LM plus its KV cache, driven one batch of token trees at a time."""

    def __init__(
        self, model: torch.nn.Module, skinny_sizes: frozenset | None = None, grouped_attention: bool = True
    ) -> None:
        """``skinny_sizes``: forward sizes (rows x width) that use the skinny matmul on CPU
        (default ``SKINNY_ROWS``; ``VerifyCost.skinny_sizes`` holds the measured choice).
        ``grouped_attention``: tree forwards read grouped-query KV heads in place
        (``tree_attention``); the attribute of that name can be switched later.
        Before the prefill, ``start_reuse`` may give it the call's ``PrefixReuse`` (``reuse``, None
        until then), to start from known KV rows (``prefix_cache``), and ``reserve`` (None) may be set:
        the positions per row decoding may add (new tokens and one tree), allocated with the prompt's
        so the cache is copied once (None: buffers of twice the prompt)."""
        self.reuse: PrefixReuse | None = None
        self.reserve: int | None = None
        self.static: StaticSteps | None = None  # set by ``use_static`` before the prefill
        self._slot_cache = None  # the pool read whole (``static_shapes.slot_cache``), static steps only
        self._start: torch.Tensor | None = None  # (1,) int64 on the device: the slot a static step writes first
        self.layout = attention_layout(model)
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        if self.layout.mode == CHAIN:
            probe_chain_forward(model, self._fresh_cache, self.layout)
        self._sdpa_configs = sdpa_configs(model)
        self.grouped_attention = grouped_attention
        self._linears = eligible_linears(model) if self.device.type == "cpu" else []
        self._row_by_row = False
        self._skinny = skinny_forwards(self._linears)
        self.skinny_sizes = frozenset(SKINNY_ROWS if skinny_sizes is None else skinny_sizes) if self._skinny else frozenset()
        self.kernel_threads = KernelThreads()  # one thread for the kernel while the machine is busy
        self.cache = self._fresh_cache()
        self.pools: list[KVPool] = []  # the cache's layers pooled after each prefill (``kv_cache.pooled``)
        self.slots = RowSlots.empty()

    @property
    def row_by_row(self) -> bool:
        """Whether the skinny matmul walks the weights row by row for few rows (``skinny_linear.walks_faster``:
        the machine's choice, kept with the cost curve); False (the blocked loop) until set."""
        return self._row_by_row

    @row_by_row.setter
    def row_by_row(self, walk: bool) -> None:
        if walk != self._row_by_row:
            self._row_by_row = walk
            self._skinny = skinny_forwards(self._linears, walk)

    def use_static(self, steps: StaticSteps) -> None:
        """Run every step after the next prefill at ``steps``' fixed widths over the whole pool
        (``static_shapes``). Raises ``UnsupportedModelError`` for models verified as chains or whose
        cache layers are not all plain KV rows (they keep transformers' own cache classes)."""
        if self.layout.mode == CHAIN or self.layout.own_cache_kinds:
            why = self.layout.chain_reason or f"its cache layers ({', '.join(self.layout.own_cache_kinds)})"
            raise UnsupportedModelError(
                f"cache_implementation='static' is not supported for {type(self.model).__name__} ({why}); "
                "drop it to decode on the dynamic cache"
            )
        self.static = steps

    def _reserve_after(self, slots: int) -> int | None:
        """Positions to allocate per row beyond a prefill's ``slots``: ``reserve``, or for static
        steps whatever fills the pool up to its ``static_capacity``."""
        if self.static is None:
            return self.reserve
        return static_capacity(slots + (self.reserve or 0)) - slots

    def _allocate(self):
        """Where the call's pool comes from (``kv_cache.Allocate``): the static steps' slab, else fresh tensors."""
        return fresh if self.static is None or self.static.slab is None else self.static.slab.take

    def _attach_static(self) -> None:
        """After a prefill: the static steps' view of the pool (one pool of every layer, ``_one_pool``)."""
        if self.static is None:
            return
        if not self._one_pool():
            raise UnsupportedModelError(
                f"{type(self.model).__name__}'s cache layers differ in shape: cache_implementation='static' needs one pool"
            )
        if self._start is None:  # the first attach of the call (after its prefill)
            self._start = torch.zeros(1, dtype=torch.int64, device=self.device)
            # every slot is read: the unwritten ones must be finite (the mask's weight 0 times a NaN
            # that a fresh allocation may hold is NaN)
            pool = self.pools[0]
            pool.keys[..., self.slots.length :, :].zero_()
            pool.values[..., self.slots.length :, :].zero_()
        self._slot_cache = slot_cache(self.pools[0], self._start)

    @property
    def rows(self) -> int:
        """B, the rows in the batch."""
        return self.slots.rows

    @property
    def length(self) -> int:
        """T, the cache slots in use (the longest row's end)."""
        return self.slots.length

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run a left-padded batch (both (B, L), int64; mask 1 = real token, None = all real) into
        a fresh cache.

        Called as HF's ``generate`` calls its first forward (position ids counting real tokens
        only; the 2D mask only where there is padding, HF's own mask builder skips a mask of
        ones), so the first logits match its own. Returns the last position's logits, shape
        (B, V), float32.
        """
        rows, length = input_ids.shape
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(torch.long).cpu()
        padded = attention_mask is not None and not bool(mask.all())
        if rows > 1 and self.layout.own_cache_kinds:
            raise UnsupportedModelError(
                f"{type(self.model).__name__}'s cache layers ({', '.join(self.layout.own_cache_kinds)}) are verified "
                "one row at a time: pass one prompt per call"
            )
        if self.reuse is not None:  # start from known rows where there are any
            seeded = self.reuse.plan(input_ids.cpu(), mask)
            if seeded is not None:
                return self._seeded_prefill(seeded)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        self.cache = self._fresh_cache(length)
        out = self._run(self.cache, input_ids.to(self.device), positions.to(self.device),
                        mask.to(self.device) if padded else None, last_only=True)
        self.pools = pooled(self.cache, self._allocate())  # every layer's rows in one tensor from here on, once per call
        self.slots = RowSlots(mask.numpy().astype(bool), positions.numpy().astype(np.int64))
        self._attach_static()
        return out.logits[:, -1].float()

    def start_reuse(self, prefixes: PrefixCache, capacity: int, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    model_kwargs: dict) -> None:
        """Let the next ``prefill`` start from known KV rows: ``prefixes`` (the model's ``PrefixCache``,
        held to ``capacity`` bytes; 0 turns reuse off and empties it) or a cache the caller passed to
        ``generate`` (in ``model_kwargs``; it takes precedence). ``input_ids`` and ``attention_mask``:
        (B, L), left-padded. Raises ``InvalidInputError`` for a caller's cache it cannot use."""
        signature = weights_signature(self.model) if capacity > 0 else None
        blocker = layout_blocker(self.layout, input_ids.shape[0])
        self.reuse = PrefixReuse.start(prefixes, capacity, signature, blocker, input_ids, attention_mask, model_kwargs)

    def finish_reuse(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, outputs: list[np.ndarray]) -> ReuseReport:
        """After decoding (``start_reuse`` was called): keep every row's sequence (its real prompt
        tokens, then ``outputs[i]``, shape (m_i,)) in the prefix cache, extend a caller's one-row,
        unpadded cache, and return what the prefill reused."""
        return self.reuse.finish(input_ids, attention_mask, outputs, self.kept_rows if self._one_pool() else None)

    def kept_rows(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch row ``position``'s kept rows in position order: keys (layers, H_kv, n, d_k) and values
        (layers, H_kv, n, d_v), n = the row's kept tokens (the cache is one pool, ``_one_pool``).
        Copies, except for a pool of one row whose spare capacity is at most ``HANDOFF_SLACK`` of n
        and not a static one (whose tensors the next call takes over, ``PoolSlab``): then views of the
        pool itself (the call is over and this model dropped, so nothing writes it again; the prefix
        cache counts its whole storage)."""
        pool, slots = self.pools[0], self.slots
        count = int(slots.next_pos[position])
        keys, values = pool.keys[:, position], pool.values[:, position]
        if slots.dense and pool.keys.shape[1] == 1 and pool.capacity <= count * (1 + HANDOFF_SLACK) and self.static is None:
            return keys[:, :, :count], values[:, :, :count]
        if slots.dense:
            return keys[:, :, :count].clone(), values[:, :, :count].clone()
        index = torch.from_numpy(np.flatnonzero(slots.visible[position])[:count]).to(keys.device)
        return keys.index_select(2, index), values.index_select(2, index)

    def _one_pool(self) -> bool:
        """Every cache layer is a ``GrowingLayer`` of one pool (one shape of rows)."""
        layers = self.cache.layers
        return (len(self.pools) == 1 and len(self.pools[0].layers) == len(layers)
                and all(isinstance(layer, GrowingLayer) for layer in layers))

    def _seeded_prefill(self, seeded: SeededPrefill) -> torch.Tensor:
        """The prefill's forwards over the new tokens after known rows (``PrefixReuse.plan``), on a cache
        seeded with them holding the prompt plus ``reserve`` positions per row, ``PREFILL_CHUNK`` tokens
        per forward (a causal mask over cached rows is a full rectangle that attention cannot skip blocks
        of, so one forward over many new tokens would do nearly twice a one-shot prefill's attention; on
        the editor's edit, 2,577 new tokens after 349 reused, one forward took 7.5 s where a one-shot
        prefill of all 2,926 took 6.9 s). Returns the last position's logits, (B, V) float32."""
        first, width = seeded.first, seeded.width
        cache, pool = seeded_cache(seeded.seeds, first, first + width + (self._reserve_after(first + width) or 0),
                                   seeded.tokens.shape[0], self._allocate())
        slots = RowSlots(seeded.visible, seeded.slot_pos)
        for start in range(0, width, PREFILL_CHUNK):
            end = min(start + PREFILL_CHUNK, width)
            out = self._forward_new(cache, seeded.tokens[:, start:end], seeded.positions[:, start:end],
                                    seeded.visible[:, : first + end], seeded.slot_pos[:, : first + end], slots.dense,
                                    first + start)
        self.cache, self.pools, self.slots = cache, [pool], slots
        self._attach_static()
        return out.logits[:, -1].float()

    def _forward_new(self, cache, tokens, positions, visible, slot_pos, dense: bool, cached: int):
        """The model over new tokens (B, c) after ``cached`` slots of ``cache`` (``visible`` and
        ``slot_pos``: (B, cached + c)): the model's own causal mask where the slots are dense and no
        layer is windowed (or it verifies chains), else a 4D one."""
        layout, device = self.layout, self.device
        rows, width = tokens.shape
        tokens_t, positions_t = torch.from_numpy(tokens).to(device), torch.from_numpy(positions).to(device)
        mask = None
        if dense and layout.windowed and layout.mode != CHAIN:
            among = torch.ones((rows, width, width), dtype=torch.bool, device=device).tril_()
            mask = layout.tree_over_dense_cache(among, cached, positions_t, self.dtype)
        elif not dense:
            slot = np.arange(visible.shape[1])
            allowed = visible[:, None, :] & (slot[None, None, :] <= cached + np.arange(width)[None, :, None])
            dead = ~visible[:, cached:]  # (B, c): a dead slot sees only itself
            allowed[:, np.arange(width), cached + np.arange(width)] |= dead
            mask = layout.masks(torch.from_numpy(allowed).to(device), positions_t, torch.from_numpy(slot_pos).to(device),
                                self.dtype)
        return self._run(cache, tokens_t, positions_t, mask, size=rows * width, last_only=True)

    def verifiable(self, tree: DraftTree) -> DraftTree:
        """``tree`` as this model can score it (``AttentionLayout.verifiable``)."""
        return self.layout.verifiable(tree)

    def score_trees(self, trees: list[DraftTree]) -> torch.Tensor:
        """``score(pack(trees))``: one forward over every row's tree; logits (B, W, V), float32."""
        return self.score(self.pack(trees))

    def pack(self, trees: list[DraftTree]) -> "PackedTrees":
        """Every row's tree (``trees[i]`` for row i, root first; chains in chain mode, see
        ``verifiable``) as the forward's inputs on the model's device: tokens, position ids
        and mask in ONE host copy (host work only; nothing is written to the cache)."""
        if len(trees) != self.rows:
            raise InvalidInputError(f"{counted(len(trees), 'tree')} for a batch of {counted(self.rows, 'row')}")
        chain = self.layout.mode == CHAIN
        if chain and any(tree.size != int(tree.depths[-1]) + 1 for tree in trees):
            raise InvalidInputError("this model verifies chains only: pass TreeModel.verifiable(tree)")
        width = max(tree.size for tree in trees)
        if self.static is not None:
            width = self.static.width(width)
        tokens, depths, among = self._pack(trees, width)
        positions = self.slots.next_pos[:, None] + depths  # (B, W)
        # Dense lone roots and chains see the whole cache through the model's own causal mask:
        # what plain decoding runs, and faster. Windowed layers need our mask for trees.
        dense = self.slots.dense
        own_mask = dense and (chain or (width == 1 and not self.layout.windowed)) and self.static is None
        tokens_t, positions_t, mask = self._inputs(tokens, positions, among, dense, own_mask)
        return PackedTrees(tokens_t, positions_t, mask, positions, grouped=not chain and not own_mask)

    @torch.no_grad()
    def score(self, packed: "PackedTrees") -> torch.Tensor:
        """One forward over the packed trees (``pack``). Returns logits of shape (B, W, V),
        float32, W = the largest tree; row i's entries past ``trees[i].size`` belong to dead
        slots and mean nothing. Afterwards the cache holds T + W slots until ``keep`` trims it."""
        rows, width = packed.positions.shape
        grouped = self._sdpa_configs if self.grouped_attention and packed.grouped else []
        if self.static is None:
            out = self._run(self.cache, packed.tokens, packed.position_ids, packed.mask, size=rows * width, grouped=grouped)
        else:
            out = self._static_run(packed, grouped)
        self.slots.open(packed.positions)
        return out.logits.float()

    def _static_run(self, packed: "PackedTrees", grouped: list):
        """A static step's forward: the packed trees (padded to one of ``static.widths``) written at
        slots T .. T + W - 1 of the pool, every slot read (``static_shapes``)."""
        rows, width = packed.positions.shape
        length, capacity = self.slots.length, self.pools[0].capacity
        if length + width > capacity:  # the pool is sized for the call (``reserve``): a bug if reached
            raise RuntimeError(f"a static step needs slots {length}..{length + width - 1}; the pool holds {capacity}")
        self._start.fill_(length)
        compiled = self.static.compiled  # then no skinny matmul or grouped attention: they swap code at run time
        if compiled and self.device.type == "cuda":
            # a new step of the compiled loop: CUDA graphs may reuse the last replay's output buffers
            # (this step's logits are copied out below, before the next replay)
            torch.compiler.cudagraph_mark_step_begin()
        graphs = torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT) if compiled else nullcontext()
        with graphs:
            out = self._run(self._slot_cache, packed.tokens, packed.position_ids, packed.mask,
                            size=None if compiled else rows * width, grouped=[] if compiled else grouped,
                            forward=self.static.forward)
        if compiled:
            out.logits = out.logits.to(torch.float32, copy=True)
        return out

    def _run(self, cache, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
             size: int | None = None, grouped: list = (), last_only: bool = False, forward=None):
        """The model's forward over ``tokens`` (B, c) at ``positions`` on ``cache``, with ``mask`` (None:
        the model's own causal one); through the skinny matmul when ``size`` (rows x width) is one
        of ``skinny_sizes``, through grouped tree attention for the ``grouped`` configs; logits of
        the last position only with ``last_only``; ``forward``: what runs the model (None: the model
        itself; a static step's compiled call, ``StaticSteps.forward``). A masked forward runs inside ``steady_attention``
        (on CUDA, off cuDNN's kernel, which builds a plan for every new key length: on the lent
        H200 a 4-token tree after 200 cached tokens took 78 ms a step with it, 28 ms without)."""
        skinny = self._skinny if size in self.skinny_sizes else []
        attention = steady_attention(self.device) if mask is not None else nullcontext()
        with torch.no_grad(), attention, tree_attention(list(grouped)), skinny_linears(skinny, self.kernel_threads):
            return (self.model if forward is None else forward)(
                input_ids=tokens,
                **self.layout.position_kwargs(positions),
                **({"attention_mask": mask} if mask is not None else {}),
                **self.layout.cache_kwargs(cache),
                use_cache=True,
                **({"logits_to_keep": 1} if last_only else {}),
            )

    def keep(self, nodes: list[np.ndarray]) -> None:
        """Keep, per row, the KV rows of tree ``nodes[i]`` (increasing, starting with root 0,
        a path from the root) after that row's kept tokens; hide the rest. Rows already in
        place (a dense row's accepted chain) are not copied."""
        rows, sources, targets = self.slots.keep(nodes)
        if rows.shape[0]:  # tree mode only: every layer is a GrowingLayer, in a pool
            for pool in self.pools:
                pool.move(rows, sources, targets)
        cut_back(self.cache, self.slots.length, self.pools)

    def drop_rows(self, finished: list[int]) -> list[int]:
        """Remove batch rows ``finished`` (indices); returns, for each remaining row in its new
        position, its index before the call. Each removed row's place is taken by the last
        row, so only that row's cache is copied (a fresh gather of every remaining row cost
        ~12 ms per layer and tensor for 16 rows of SmolLM2-135M after 300 tokens)."""
        order = list(range(self.rows))
        for row in sorted(finished, reverse=True):
            last = len(order) - 1
            live = int(self.slots.ends[last])
            if self.reuse is not None:
                self.reuse.retiring(row, self.kept_rows(row) if self.reuse.keeps_rows and self._one_pool() else None)
            for pool in self.pools:
                pool.retire_row(row, live)
            self.slots.drop(row)
            order[row] = order[last]
            order.pop()
        if order:
            self.slots.settle()
            cut_back(self.cache, self.slots.length, self.pools)
            if self.static is not None and finished:
                self._attach_static()  # the pool's views now span fewer rows
        return order

    def _fresh_cache(self, slots: int = 0):
        """An empty cache whose first update (a prefill of ``slots`` per row) allocates what decoding adds (``_reserve_after``)."""
        return model_cache(self.model.config, bool(self.layout.own_cache_kinds), self._reserve_after(slots))

    @staticmethod
    def _pack(trees: list[DraftTree], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Trees padded to ``width``: tokens (B, W), depths (B, W), and (B, W, W) bool, which
        new slots each new slot sees (its ancestors and itself; a dead slot only itself). Lone
        roots (width 1, most steps of a fresh batch) are read in one pass (2.4 against 5.0 us for
        one row, 4.1 against 11.1 for eight, scratch timings); a wider tree is written by one
        compiled call per row (``DraftTree.pack_into``)."""
        rows = len(trees)
        if width == 1:
            tokens = np.fromiter((tree.tokens[0] for tree in trees), dtype=np.int64, count=rows).reshape(rows, 1)
            return tokens, np.zeros((rows, 1), dtype=np.int64), np.ones((rows, 1, 1), dtype=bool)
        tokens = np.empty((rows, width), dtype=np.int64)
        depths = np.empty((rows, width), dtype=np.int64)
        among = np.empty((rows, width, width), dtype=bool)
        for row, tree in enumerate(trees):
            tree.pack_into(tokens[row], depths[row], among[row])
        return tokens, depths, among

    def _inputs(self, tokens: np.ndarray, positions: np.ndarray, among: np.ndarray, dense: bool, own_mask: bool):
        """Token ids (B, W), position ids (B, W) and the mask, on the model's device in ONE host copy.

        ``among``: (B, W, W) bool, which new slots each new slot sees. The mask is None with
        ``own_mask`` (the model's causal mask); in chain mode the (B, T + W) 0/1 mask of real
        slots, from which the model builds its own causal mask; otherwise the additive
        (B, 1, W, T + W) one in the model's dtype (a dict of them by layer kind, see
        ``AttentionLayout.masks``). A ``dense`` cache's part of it is built on the device.
        """
        rows, width = positions.shape
        slots = self.slots
        if self.static is not None:
            return static_inputs(slots, self.pools[0].capacity, tokens, positions, among, self.layout, self.dtype,
                                 self.device)
        if own_mask:
            moved = to_device([tokens, positions], self.device)
            return moved[0], moved[1], None
        if self.layout.mode == CHAIN:
            real = np.concatenate([slots.visible, np.ones((rows, width), dtype=bool)], axis=1).astype(np.int64)
            moved = to_device([tokens, positions, real], self.device)
            return moved[0], moved[1], moved[2]
        if dense:  # slot j holds position j in every row, all visible
            tokens_t, positions_t, among_t = to_device([tokens, positions, among], self.device)
            return tokens_t, positions_t, self.layout.tree_over_dense_cache(among_t, slots.length, positions_t, self.dtype)
        cache = np.broadcast_to(slots.visible[:, None, :], (rows, width, slots.length))
        allowed = np.concatenate([cache, among], axis=2)
        key_pos = np.concatenate([slots.slot_pos, positions], axis=1)
        tokens_t, positions_t, allowed_t, key_pos_t = to_device([tokens, positions, allowed, key_pos], self.device)
        return tokens_t, positions_t, self.layout.masks(allowed_t, positions_t, key_pos_t, self.dtype)



def validate_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int, limit: int | None) -> None:
    """Raise InvalidInputError for prompts the engine cannot serve, before any model work.

    ``input_ids`` and ``attention_mask``: (B, L), mask 1 on real tokens, left padding only
    (one unpadded row: B = 1 and a mask of ones). ``limit``: the model's context (``context_limit``).
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise InvalidInputError(
            f"input_ids and attention_mask must both have shape (B, L); got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    if input_ids.shape[1] == 0:
        raise InvalidInputError("the prompt is empty")
    mask = attention_mask.to(torch.long)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise InvalidInputError("attention_mask must hold only 0 and 1")
    real = mask.sum(dim=1)
    if bool((real == 0).any()):
        raise InvalidInputError("a row of the batch is empty (its attention_mask is all 0)")
    if bool((mask[:, :-1] > mask[:, 1:]).any()):
        raise InvalidInputError("right padding is not supported; tokenize with padding_side='left'")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise InvalidInputError(f"token ids must lie in [0, {vocab_size}); got range [{low}, {high}]")
    if limit is not None and int(real.max()) >= limit:
        raise InvalidInputError(f"a prompt has {int(real.max())} tokens; the model's context holds {limit}")
