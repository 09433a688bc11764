"""Which of ``generate``'s options the plugin honours, refuses, or passes on, and its return value.

- Refused (``InvalidInputError`` naming the option, before any model work):
  options whose result tree verification cannot reproduce (beams, several
  sequences, attentions / hidden states, contrastive search, DoLa, guidance,
  SynthID watermarking) or that ask for another speculative method.
- Passed on: ``generate``'s ``tokenizer`` (for ``stop_strings``) and
  ``assistant_model``, which transformers 5.x drops for callables
  (``model.generate_kwargs`` puts them back).
- Returned: with ``return_dict_in_generate`` HF's ``GenerateDecoderOnlyOutput``,
  with per-token scores / logits when asked (``ScoreRecorder``).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable

import numpy as np
import torch
from transformers.generation import GenerateDecoderOnlyOutput, SynthIDTextWatermarkingConfig

from retrieval_draft.errors import InvalidInputError


def _over(limit):
    """A test for options that are set above ``limit``."""
    return lambda value: value is not None and value > limit


_ONE_SEQUENCE = "retrieval_draft decodes one sequence"

# option -> (is it set so that honouring it needs what we cannot do?, why: a reason that completes
# "OPTION=VALUE is not supported: ", never repeating it); the specific before num_beams
_REFUSED: "MappingProxyType[str, tuple[Callable, str]]" = MappingProxyType({
    "num_beam_groups": (_over(1), "group beam search keeps several beams; " + _ONE_SEQUENCE),
    "num_return_sequences": (_over(1), "one sequence per call; call generate again for more samples"),
    "constraints": (lambda v: v is not None, "constrained beam search keeps several beams; " + _ONE_SEQUENCE),
    "force_words_ids": (lambda v: v is not None, "constrained beam search keeps several beams; " + _ONE_SEQUENCE),
    "num_beams": (_over(1), "beam search keeps several beams; " + _ONE_SEQUENCE),
    "output_attentions": (bool, "attentions of a verified token tree are not HF's per-token attentions"),
    "output_hidden_states": (bool, "hidden states of a verified token tree are not HF's per-token states"),
    "dola_layers": (
        lambda v: v is not None, "DoLa decoding contrasts early layers' logits, which a verified tree does not compute"
    ),
    "guidance_scale": (
        lambda v: v is not None and v != 1,
        "classifier-free guidance runs the model inside a stateful processor",
    ),
    "prompt_lookup_num_tokens": (
        lambda v: v is not None,
        "HF's own prompt lookup; retrieval_draft drafts by itself (prompt lookup included)",
    ),
    "assistant_early_exit": (lambda v: v is not None, "HF's self-speculation; retrieval_draft drafts by itself"),
    "use_mtp": (bool, "multi-token-prediction drafting; retrieval_draft drafts by itself"),
    "cache_implementation": (
        lambda v: v not in (None, "dynamic", "static"),
        "retrieval_draft decodes on its own in-place cache (the default) or, with 'static', at fixed shapes "
        "over a preallocated one, compiled as HF compiles its static cache",
    ),
    "watermarking_config": (
        lambda v: isinstance(v, SynthIDTextWatermarkingConfig),
        "SynthID watermarking keeps per-call state and cannot score a tree",
    ),
})


def check_options(generation_config, assistant_model=None, model=None) -> None:
    """Raise ``InvalidInputError`` naming the first option the plugin cannot honour (``model``:
    the model ``generate`` was called on, refused when compiled in place).

    Greedy and sampling with any stateless logits processor / warper and any
    stopping criterion are honoured; so are ``return_dict_in_generate``,
    ``output_scores`` and ``output_logits``.
    """
    if assistant_model is not None:
        raise InvalidInputError("assistant_model is not supported: retrieval_draft drafts by itself; drop it")
    if model is not None and getattr(model, "_compiled_call_impl", None) is not None:
        raise InvalidInputError(
            "a model compiled in place (model.compile()) would recompile for every tree shape: call generate on "
            "the uncompiled model with cache_implementation='static', which compiles fixed-shape steps itself"
        )
    for option, (refuses, why) in _REFUSED.items():
        value = getattr(generation_config, option, None)
        if refuses(value):
            raise InvalidInputError(f"{option}={value!r} is not supported: {why}")
    contrastive = generation_config.penalty_alpha
    if contrastive is not None and contrastive > 0 and not generation_config.do_sample:
        raise InvalidInputError(f"penalty_alpha={contrastive!r} (contrastive search) is not supported")


class ScoreRecorder:
    """Per-token raw logits and processed scores, as HF's ``generate`` returns them.

    Called by the engine after each step with the raw logits of the tokens it
    emitted (shape (k, V), float32, one row per token) and the whole sequence
    through them (shape (L + m,)); the prefix of token j is
    ``sequence[: L + m - k + j]``. Costs nothing unless scores or logits were asked for.
    """

    def __init__(self, processor, scores: bool, logits: bool) -> None:
        self.processor = processor
        self.scores: list[torch.Tensor] | None = [] if scores else None
        self.logits: list[torch.Tensor] | None = [] if logits else None

    def __call__(self, rows: torch.Tensor, sequence: np.ndarray) -> None:
        start = sequence.shape[0] - rows.shape[0]
        for j in range(rows.shape[0]):
            row = rows[j : j + 1]  # (1, V)
            if self.logits is not None:
                self.logits.append(row.clone())
            if self.scores is not None:
                self.scores.append(self._processed(row, sequence[: start + j]))

    def _processed(self, row: torch.Tensor, prefix: np.ndarray) -> torch.Tensor:
        """The processor's scores (1, V) for ``row`` after ``prefix`` (shape (P,))."""
        if self.processor is None or len(self.processor) == 0:
            return row.clone()
        ids = torch.from_numpy(prefix.copy()).to(row.device).unsqueeze(0)
        return self.processor(ids, row.clone())


def score_recorder(generation_config, processor) -> ScoreRecorder | None:
    """A recorder when the caller asked for per-token scores or logits in a returned dict, else None."""
    if not generation_config.return_dict_in_generate:
        return None
    scores, logits = bool(generation_config.output_scores), bool(generation_config.output_logits)
    return ScoreRecorder(processor, scores, logits) if scores or logits else None


def build_output(sequences: torch.Tensor, generation_config, recorders: list[ScoreRecorder | None]):
    """What HF's ``generate`` returns: ``sequences`` (shape (B, L + m)) itself, or with
    ``return_dict_in_generate`` a ``GenerateDecoderOnlyOutput`` whose ``scores`` / ``logits``
    are tuples of m tensors of shape (B, V) when asked for (``past_key_values`` is None).

    ``recorders`` holds one recorder per row (all None when nothing was asked for). Where a
    row stopped before the longest one, its entries are NaN: HF's are scores of the padding
    it goes on feeding that row, which no verified tree computes.
    """
    if not generation_config.return_dict_in_generate:
        return sequences
    scores = _stacked([r.scores if r is not None else None for r in recorders])
    logits = _stacked([r.logits if r is not None else None for r in recorders])
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits)


def _stacked(per_row: list[list[torch.Tensor] | None]) -> tuple[torch.Tensor, ...] | None:
    """Per-row lists of (1, V) tensors (m_i of them) as m tensors of shape (B, V), m = max m_i;
    a row's missing entries NaN. None when nothing was recorded."""
    if not per_row or any(entries is None for entries in per_row):
        return None
    if len(per_row) == 1:
        return tuple(per_row[0])
    longest = max(len(entries) for entries in per_row)
    first = next(entries[0] for entries in per_row if entries)  # every row records at least one token
    missing = torch.full_like(first, float("nan"))
    return tuple(
        torch.cat([entries[j] if j < len(entries) else missing for entries in per_row]) for j in range(longest)
    )


def padded_sequences(input_ids: torch.Tensor, outputs: list[np.ndarray], pad: int) -> torch.Tensor:
    """(B, L + m) on ``input_ids``' device: each row's prompt and new tokens (``outputs[i]``,
    shape (m_i,)), rows shorter than the longest filled with ``pad`` as HF's batched ``generate`` fills them."""
    longest = max(output.shape[0] for output in outputs)
    tail = np.full((len(outputs), longest), pad, dtype=np.int64)
    for row, output in enumerate(outputs):
        tail[row, : output.shape[0]] = output
    return torch.cat([input_ids, torch.from_numpy(tail).to(input_ids.device)], dim=1)
