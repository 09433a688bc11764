"""Side-by-side runs of plain HF ``generate`` and ours on one request.

Decode speed excludes prefill: both methods pay the same forward pass over
the prompt, timed on its own, so tokens/s = new tokens / (wall - prefill).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.sessions.session import GenerationRequest, Session


@dataclass(frozen=True)
class Comparison:
    """One side-by-side run. Times in seconds; ``sampled``: both runs sampled (else greedy)."""

    text: str
    new_tokens: int
    prefill_s: float
    plain_wall_s: float
    ours_wall_s: float
    identical: bool | None
    stats: DecodeStats
    sampled: bool = False

    @property
    def plain_tokens_per_s(self) -> float:
        return self.new_tokens / max(self.plain_wall_s - self.prefill_s, 1e-9)

    @property
    def ours_tokens_per_s(self) -> float:
        return self.new_tokens / max(self.ours_wall_s - self.prefill_s, 1e-9)

    @property
    def speedup(self) -> float:
        return self.ours_tokens_per_s / self.plain_tokens_per_s

    @property
    def plain_label(self) -> str:
        """The baseline's row name: what ran (HF's greedy or sampling ``generate``)."""
        return "HF sampling generate" if self.sampled else "HF greedy generate"

    def table(self) -> str:
        """A small markdown table of the two runs."""
        return "\n".join(
            [
                "| method | decode tokens/s | prefill s | new tokens |",
                "|---|---|---|---|",
                f"| {self.plain_label} | {self.plain_tokens_per_s:.1f} | {self.prefill_s:.3f} | {self.new_tokens} |",
                f"| retrieval-draft | {self.ours_tokens_per_s:.1f} | {self.prefill_s:.3f} | {self.new_tokens} |",
                "",
                f"speedup: {self.speedup:.2f}x",
                f"mean accepted tokens per step: {self.stats.mean_accepted:.2f}",
                f"identical: {_yes_no(self.identical)}",
            ]
        )


def _yes_no(flag: bool | None) -> str:
    return "n/a (sampling: each run draws its own sample)" if flag is None else ("yes" if flag else "no")


WARMUP_PROMPT = "Say hello."


def compare_with_plain(session: Session, request: GenerationRequest, warmup: bool = True) -> Comparison:
    """Run plain HF generate and ours on ``request``; greedy outputs must match.

    Under sampling the two draw different samples, so ``identical`` is None.
    """
    input_ids = session.encode(request)
    if warmup:  # torch's and the plugin's first-call set-up, on another prompt: the request's own
        # would be in the output history and the prefix cache when it runs
        short = GenerationRequest(**{**request.__dict__, "prompt": WARMUP_PROMPT, "max_new_tokens": 4})
        warm_ids = session.encode(short)
        session.plain_ids(warm_ids, short)
        session.generate_ids(warm_ids, short)
    prefill = min(session.prefill_seconds(input_ids) for _ in range(3))
    plain, plain_s = session.plain_ids(input_ids, request)
    ours, stats, ours_s = session.generate_ids(input_ids, request)
    identical = None if request.sampling else plain.shape == ours.shape and bool(torch.equal(plain, ours))
    new_tokens = ours.shape[1] - input_ids.shape[1]
    if plain.shape[1] != ours.shape[1]:
        new_tokens = min(new_tokens, plain.shape[1] - input_ids.shape[1])
    return Comparison(
        text=session.decode_new(input_ids, ours),
        new_tokens=new_tokens,
        prefill_s=prefill,
        plain_wall_s=plain_s,
        ours_wall_s=ours_s,
        identical=identical,
        stats=stats,
        sampled=bool(request.sampling),
    )
