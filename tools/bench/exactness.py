"""The harness's exactness verdict for outputs that part from plain greedy in reduced precision.

In float32 our output must equal plain greedy ``generate`` token for token. In bfloat16 or
float16 a k-token forward rounds differently from k one-token forwards, so an output may part from
plain greedy, but only where plain's two best tokens were tied within the dtype's rounding
(``retrieval_draft.divergence``). For a prompt where some run parted, ``near_tie_verdicts`` runs
plain greedy once more, untimed, keeping its logits (greedy is deterministic: the same tokens), and
judges each parted output at its first difference, as ``tools.gpu_check`` does.
"""

from __future__ import annotations

import torch

from retrieval_draft.divergence import first_divergence


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
