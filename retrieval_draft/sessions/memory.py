"""What the plugin remembers between calls: the one process-wide object.

``PluginMemory`` holds, per live model (weakly keyed, so it goes with the
model), a ``ModelMemory``: the forward-cost curve, the acceptance rates its
planners observed (greedy and sampling apart), the output history that
the default drafters copy from and the logits-recycling table; and, for the process, the opened datastores
(``StoreCache``) and tokenizer fingerprints. ``PROCESS_MEMORY`` is the
instance the plugin uses unless a call passes ``draft_memory=``; users may
hold it, ``reset()`` it, or pass ``draft_learning=False`` to bypass the
learned parts. Nothing in it changes what is generated, only how fast.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from retrieval_draft.drafters.history import HistoryDrafter
from retrieval_draft.drafters.recycling import RecyclingDrafter
from retrieval_draft.model.prefix_cache import PrefixCache
from retrieval_draft.model.static_shapes import PoolSlab
from retrieval_draft.planning.calibration import AcceptanceCalibrator, RankCorrection
from retrieval_draft.planning.cost import ObservedCost, VerifyCost, clamped, plausible
from retrieval_draft.planning.cost_probe import CostProbe
from retrieval_draft.planning.planner import DrafterGate
from retrieval_draft.store.store_cache import StoreCache


@dataclass
class ModelMemory:
    """One model's memory in this process.

    Attributes:
        cost: measured forward cost by tree size, or None until first needed.
        probe: the measurement of ``cost`` while decoding completes it (``cost_probe``), else None.
        observed: corrections of ``cost`` from the forward times decoding saw (the default path's;
            only these may lower the curve kept on disk).
        static_observed: the same for ``cache_implementation="static"`` calls (fixed widths, compiled
            where HF compiles), kept apart from the default path's.
        rates: sampling flag -> drafter name -> calibrator (shared, updated in place);
            read from the disk cache when the memory is created (``rates_file``).
        ranks: sampling flag -> what the merged trees' ranks delivered (``RankCorrection``), this process only.
        gate: which drafters pay for their time (``DrafterGate``), this process only: a call starts
            asking only the drafters earlier calls found paying (the rest every few steps).
        history: earlier prompts and outputs (bounded, 4 MB at most by default).
        rechecked: whether this process measured the curve again because decoding's forwards drifted from it.
        recycled: the model's recorded top-k successors per token (``PluginMemory.recycled``),
            None until first needed.
        prefixes: KV rows of recent calls' sequences, by token prefix (``model.prefix_cache``),
            this process only; a call starts from the longest one its prompt begins with.
        compiled: compile config (its ``repr``) -> the model's forward compiled for static steps
            (``static_shapes.compiled_forward``), made by the first ``cache_implementation="static"``
            call that compiles, so later calls replay its graphs instead of compiling again.
        slab: the last static call's pool tensors, handed to the next call of the same shape
            (``static_shapes.PoolSlab``), so those graphs find the cache at the addresses they recorded.
        lock: held by the plugin for a whole generation, so calls with one model
            from several threads run one after another (a tree forward switches
            the model's attention function and linear layers while it runs).
    """

    cost: VerifyCost | None = None
    probe: CostProbe | None = None
    observed: ObservedCost = field(default_factory=ObservedCost)
    static_observed: ObservedCost = field(default_factory=ObservedCost)
    rates: dict[bool, dict[str, AcceptanceCalibrator]] = field(default_factory=lambda: {False: {}, True: {}})
    ranks: dict[bool, RankCorrection] = field(default_factory=lambda: {False: RankCorrection(), True: RankCorrection()})
    gate: DrafterGate = field(default_factory=DrafterGate)
    history: HistoryDrafter = field(default_factory=HistoryDrafter)
    recycled: RecyclingDrafter | None = None
    prefixes: PrefixCache = field(default_factory=PrefixCache, repr=False)
    rates_saved_at: float = 0.0  # time.monotonic() of the last save to disk
    rechecked: bool = False  # this process already measured a drifted curve again (once per process)
    compiled: dict = field(default_factory=dict, repr=False)
    slab: PoolSlab = field(default_factory=PoolSlab, repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class PluginMemory:
    """Per-model memories plus the process's opened datastores; thread-safe creation.

    ``persist``: read and write learned rates in the disk cache (``rates_file``).
    """

    def __init__(self, persist: bool = True) -> None:
        self.persist = persist
        self._models: "weakref.WeakKeyDictionary[torch.nn.Module, ModelMemory]" = weakref.WeakKeyDictionary()
        self._fingerprints: "weakref.WeakKeyDictionary[object, tuple[int, str]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.stores = StoreCache()

    def model(self, model: torch.nn.Module) -> ModelMemory:
        """The memory of ``model`` (created empty on first use)."""
        with self._lock:
            memory = self._models.get(model)
            if memory is None:
                memory = self._models[model] = ModelMemory()
                if self.persist:
                    from retrieval_draft.planning.rates_file import rates_path, read_rates

                    memory.rates = read_rates(rates_path(model)) or memory.rates
            return memory

    def save_learned(self, model: torch.nn.Module, force: bool = False) -> None:
        """When ``persist`` and the last save is old enough: write ``model``'s learned rates
        to disk, and its cost curve too where observed forward times proved it too dear
        (``ObservedCost.proven_cheaper``; a busy spell never overwrites a good curve)."""
        from retrieval_draft.planning.cost_file import CORRECTED, store_cost
        from retrieval_draft.planning.rates_file import SAVE_INTERVAL_S, rates_path, write_rates

        memory = self.model(model)
        now = time.monotonic()
        if not self.persist or not (force or not memory.rates_saved_at or now - memory.rates_saved_at >= SAVE_INTERVAL_S):
            return
        memory.rates_saved_at = now
        write_rates(rates_path(model), memory.rates)
        cheaper = memory.observed.proven_cheaper(memory.cost) if memory.cost is not None else None
        if cheaper is not None:  # sizes it left dearer than the plausible limit of its new lone root are lowered to it
            memory.cost = clamped(cheaper, on_gpu(model))
            memory.observed = ObservedCost()
            store_cost(model, memory.cost, CORRECTED)

    def recycled(self, model: torch.nn.Module) -> RecyclingDrafter:
        """The model's logits-recycling drafter (started empty on first use). Like the output
        history it lives in this process; ``RecyclingDrafter.save``/``load`` keep it on disk."""
        memory = self.model(model)
        if memory.recycled is None:
            memory.recycled = RecyclingDrafter(int(model.config.vocab_size))
        return memory.recycled

    def compiled(self, model: torch.nn.Module, compile_config) -> Callable:
        """``model``'s forward compiled for static steps with ``compile_config`` (None: HF's defaults),
        made once per model and config in this process (``static_shapes.compiled_forward``)."""
        from retrieval_draft.model.static_shapes import compiled_forward

        kept = self.model(model).compiled
        key = repr(compile_config.to_dict()) if compile_config is not None else None
        if key not in kept:
            kept[key] = compiled_forward(model, compile_config)
        return kept[key]

    def knows(self, model: torch.nn.Module) -> bool:
        """Whether anything is remembered for ``model``."""
        return model in self._models

    def cost(self, model: torch.nn.Module) -> VerifyCost:
        """The model's cost curve: remembered, else read from the disk cache, else measured
        now over random chains (``measure_cost``, completing a measurement decoding began)."""
        return self.planning_cost(model, can_probe=False)[0]

    def known_cost(self, model: torch.nn.Module) -> VerifyCost | None:
        """The model's curve where one is remembered or stored on disk (then remembered); None
        where neither holds one (nothing is measured here)."""
        from retrieval_draft.planning.cost_file import load_cost

        memory = self.model(model)
        if memory.cost is None and memory.probe is None:  # a probe in progress: the disk had no curve
            memory.cost = load_cost(model)
        return memory.cost

    def planning_cost(self, model: torch.nn.Module, can_probe: bool) -> tuple[VerifyCost | None, CostProbe | None]:
        """What a call plans with: (the model's curve, None) where one is remembered or stored;
        else, for a call that can probe while it decodes (``can_probe``: one row, tree
        verification), (None, the model's measurement in progress); else the curve measured now."""
        from retrieval_draft.planning.cost_probe import measure_cost, new_probe

        memory = self.model(model)
        if self.known_cost(model) is not None:
            return memory.cost, None
        if memory.probe is None:
            memory.probe = new_probe(model)
        if can_probe:
            return None, memory.probe
        self._adopt(model, measure_cost(model, probe=memory.probe))
        return memory.cost, None

    def after_call(self, model: torch.nn.Module) -> None:
        """After a call with ``model``: a measurement it completed becomes the model's curve; and once
        per process, a curve that the call's forwards drifted from (``ObservedCost.drifted``: measured in
        other conditions, or kept from another day) is measured again from the next single-row call's
        forwards, its matmul paths included, and the corrections start afresh."""
        from retrieval_draft.planning.cost_probe import new_probe

        memory = self.model(model)
        if memory.probe is not None and memory.probe.complete:
            self._adopt(model, memory.probe.curve())
        elif memory.cost is not None and not memory.rechecked and memory.observed.drifted():
            memory.rechecked = True
            memory.cost, memory.probe, memory.observed = None, new_probe(model), ObservedCost()

    def _adopt(self, model: torch.nn.Module, cost: VerifyCost) -> None:
        """``cost``, a finished measurement, becomes ``model``'s curve, kept on disk when the
        machine stayed steady while it was measured and the curve is plausible (``cost.plausible``);
        an implausible one is used lowered to the plausible limit (decoding's forwards then correct
        it), never kept."""
        from retrieval_draft.planning.cost_file import store_cost

        memory = self.model(model)
        memory.probe = None
        if not plausible(cost, on_gpu(model)):
            memory.cost = clamped(cost, on_gpu(model))
            return
        memory.cost = cost
        if cost.steady:
            store_cost(model, cost)

    def fingerprint(self, tokenizer) -> str:
        """The tokenizer's fingerprint, computed once per tokenizer object and size
        (adding tokens recomputes it; hashing a 50k vocabulary takes tens of ms)."""
        from retrieval_draft.store.tokenizer import tokenizer_fingerprint

        try:
            found = self._fingerprints.get(tokenizer)
        except TypeError:  # not weakly referenceable: compute every time
            return tokenizer_fingerprint(tokenizer)
        if found is None or found[0] != len(tokenizer):
            found = self._fingerprints[tokenizer] = (len(tokenizer), tokenizer_fingerprint(tokenizer))
        return found[1]

    def reset(self) -> None:
        """Forget every model's memory and every opened store."""
        with self._lock:
            self._models.clear()
            self._fingerprints.clear()
        self.stores.clear()


def on_gpu(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs on an accelerator (its cost curve is then nearly flat)."""
    return next(model.parameters()).device.type != "cpu"


PROCESS_MEMORY = PluginMemory()
