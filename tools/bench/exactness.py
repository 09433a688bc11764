"""The exactness rule in reduced precision, and the harness's verdicts by it.

In float32 our greedy output equals plain greedy ``generate`` token for token. In bfloat16
and float16 a k-token forward rounds differently from k one-token forwards, so the two
can part where the model's two best tokens are tied within the dtype's rounding. The rule:
at the first position where the outputs differ, plain ``generate``'s own logits for its
token and for ours lie within ``NEAR_TIE_ULPS`` units in the last place of the dtype, taken
at the size of the row's largest logit (the scale rounding errors in the logits follow).
Anything else is a bug. ``first_divergence`` finds that position; for a prompt where some run
parted, ``near_tie_verdicts`` runs plain greedy once more, untimed, keeping its logits (greedy is
deterministic: the same tokens), and judges each parted output there, as ``tools.gpu_check`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEAR_TIE_ULPS = 4  # rounding units of the dtype; see ``near_tie_tolerance``


@dataclass(frozen=True)
class Divergence:
    """Where two greedy outputs first differ and how close the model's choice was there.

    Attributes:
        position: index into the new tokens (0 = the first generated token).
        gap: plain logit of plain's token minus plain logit of ours (>= 0 for greedy).
        tolerance: the near-tie bound for this dtype and logit scale.
    """

    position: int
    gap: float
    tolerance: float

    @property
    def near_tie(self) -> bool:
        return self.gap <= self.tolerance


def near_tie_tolerance(dtype: torch.dtype, scale: float) -> float:
    """``NEAR_TIE_ULPS`` units in the last place of ``dtype`` at magnitude ``scale`` (0 in float32
    and float64, where outputs must be identical)."""
    if dtype in (torch.float32, torch.float64):
        return 0.0
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(torch.tensor(max(abs(scale), info.tiny), dtype=torch.float64)))
    return float(NEAR_TIE_ULPS * info.eps * 2.0 ** exponent)


def first_divergence(
    plain_new: torch.Tensor, ours_new: torch.Tensor, plain_logits: torch.Tensor, dtype: torch.dtype
) -> Divergence | None:
    """The first differing position of two greedy outputs, or None when one is a prefix of the other.

    Args:
        plain_new: (m,) plain ``generate``'s new tokens.
        ours_new: (m',) ours.
        plain_logits: (m, V) plain ``generate``'s logits for each new token
            (``output_logits=True``), in any float dtype.
        dtype: the model's dtype (sets the tolerance).
    """
    length = min(plain_new.shape[0], ours_new.shape[0])
    differs = (plain_new[:length] != ours_new[:length]).nonzero()
    if differs.numel() == 0:
        return None
    at = int(differs[0, 0])
    row = plain_logits[at].double()
    gap = float(row[plain_new[at]] - row[ours_new[at]])
    return Divergence(at, gap, near_tie_tolerance(dtype, float(row.abs().max())))


def near_tie_verdicts(model, input_ids: torch.Tensor, reference: torch.Tensor, outputs: list[torch.Tensor],
                      plain_kwargs: dict) -> list[dict]:
    """One verdict per output in ``outputs`` (each (1, L + m'), on the CPU) against plain greedy's
    ``reference`` (1, L + m) for ``input_ids`` (1, L), which ``model.generate(input_ids,
    **plain_kwargs)`` gave: {"exact", "first_difference", "gap", "tolerance"}; exact when the first
    difference is a near-tie of plain's logits there, or when the outputs agree where both have tokens."""
    with torch.inference_mode():
        plain = model.generate(input_ids, **plain_kwargs, output_logits=True, return_dict_in_generate=True)
    start = input_ids.shape[1]
    expected = plain.sequences[0, start:].cpu()
    if not torch.equal(expected, reference[0, start:]):  # not reproducible: nothing to judge against
        return [{"exact": False, "first_difference": None, "gap": None, "tolerance": None,
                 "note": "plain greedy gave another output when run again"} for _ in outputs]
    logits = torch.stack(plain.logits)[:, 0].float().cpu()
    verdicts = []
    for output in outputs:
        split = first_divergence(expected, output[0, start:], logits, model.dtype)
        verdicts.append({
            "exact": split is None or split.near_tie,
            "first_difference": None if split is None else split.position,
            "gap": None if split is None else round(split.gap, 6),
            "tolerance": None if split is None else split.tolerance,
        })
    return verdicts
