"""What one generation's decoding did and where its time went (``DecodeStats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeStats:
    """Per-call statistics; times in seconds. A step is one row verified once: B rows
    decoding together take B steps per forward.

    A forward's host time splits into phases: ``draft_s`` (drafters' proposals), ``plan_s``
    (merging, sizing and pruning the trees), ``pack_s`` (tokens, positions and masks to the
    device), ``forward_s`` (the model call: on CPU the forward itself, on a GPU its launch),
    ``readout_s`` (the host read, verification, tree observers) and ``accept_s`` (cache keep,
    emitting: stop checks, streamers, drafters' ``accept``, learning).

    Prefix reuse (``model.prefix_reuse``): ``reused_tokens`` prompt tokens started from KV rows
    of earlier calls (or of a cache the caller passed), ``prefilled_tokens`` run by the prefill,
    both summed over rows; ``reuse_note`` says why rows were not reused or kept (reuse off, a
    cache layout), else None; ``prefix_cache_bytes`` is what the model's cache holds after the call."""

    rows: int = 0
    forwards: int = 0  # tree forwards (batch steps)
    steps: int = 0  # rows verified, summed over forwards
    new_tokens: int = 0  # every row's new tokens, the prefill's first token included
    step_tokens: int = 0  # tokens emitted by tree steps (after the prefill's first token per row)
    tree_nodes: int = 0  # real tree nodes verified, summed over steps
    tree_slots: int = 0  # rows x width, summed over forwards: tokens the forwards processed
    prefill_s: float = 0.0
    draft_s: float = 0.0
    plan_s: float = 0.0
    pack_s: float = 0.0
    forward_s: float = 0.0
    readout_s: float = 0.0
    accept_s: float = 0.0
    device_forward_s: float = 0.0  # the forwards as the device timed them (``ForwardTimer``: CUDA events on a GPU)
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    reuse_note: str | None = None
    prefix_cache_bytes: int = 0

    @property
    def verify_s(self) -> float:
        """Time after drafting: planning, packing, the forward, readout and accepting."""
        return self.plan_s + self.pack_s + self.forward_s + self.readout_s + self.accept_s

    @property
    def decode_s(self) -> float:
        """Time after prefill: drafting plus verification."""
        return self.draft_s + self.verify_s

    @property
    def host_s(self) -> float:
        """Time after prefill outside the forward as the device ran it (``decode_s - device_forward_s``):
        on CPU everything but the model call; on a GPU, where the call only launches the forward and
        the readout waits for it, the host work the forward did not hide."""
        return self.decode_s - self.device_forward_s

    @property
    def mean_accepted(self) -> float:
        """Tokens emitted per step, bonus token included (plain decoding: 1.0)."""
        return self.step_tokens / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        """Plain numbers for JSON and printing."""
        phases = ("draft_s", "plan_s", "pack_s", "forward_s", "readout_s", "accept_s", "device_forward_s")
        return {
            "rows": self.rows,
            "forwards": self.forwards,
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "mean_accepted": round(self.mean_accepted, 3),
            "mean_tree_nodes": round(self.tree_nodes / self.steps, 2) if self.steps else 0.0,
            "mean_width": round(self.tree_slots / self.steps, 2) if self.steps else 0.0,
            "prefill_s": round(self.prefill_s, 4),
            **{name: round(getattr(self, name), 5) for name in phases},
            "verify_s": round(self.verify_s, 4),
            "host_s": round(self.host_s, 5),
            "decode_tokens_per_s": round(self.step_tokens / self.decode_s, 2) if self.decode_s else 0.0,
            "reused_tokens": self.reused_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "reuse_note": self.reuse_note,
            "prefix_cache_bytes": self.prefix_cache_bytes,
        }
