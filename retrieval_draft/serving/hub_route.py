"""The ``generate`` a model folder's ``custom_generate/generate.py`` hands every call to.

transformers calls it in two ways: ``model.generate(**inputs, custom_generate=FOLDER,
trust_remote_code=True)`` (the Hub route, per call), and, for a model loaded with
``trust_remote_code`` from a folder that holds ``custom_generate/`` (``transformers serve``), as
the model's ``generate`` itself. Either way it receives ``generate``'s arguments before any input
preparation and hands them back to HF's ``generate`` with ``retrieval_draft.generate`` as the
decoding function, so HF prepares the inputs as usual. Three things happen on the way:

- HF's ``streamer=`` goes on as HF hands it to the callable (``model.generate_kwargs`` recovers it,
  ``plugin.keywords.one_streamer`` checks it beside ``draft_streamer=``);
- the options the model's folder carries (``options.OPTIONS_FILE``, written by ``retrieval-draft
  serve``) are added under the caller's own keywords;
- a call for no new tokens (``max_new_tokens=0``; a server's ``max_tokens: 0``) reads the prompt into
  the prefix cache and returns it (``retrieval_draft.prefill``): an editor warming the cache while its
  user types. HF's own ``generate`` refuses 0.
"""

from __future__ import annotations

import logging
import time

import torch
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.utils import GenerationMixin

from retrieval_draft.decode.engine import DecodeStats
from retrieval_draft.errors import InvalidInputError, RetrievalDraftError
from retrieval_draft.plugin.hf import generate as retrieval_generate
from retrieval_draft.plugin.hf import prefill
from retrieval_draft.plugin.keywords import one_streamer
from retrieval_draft.serving.options import read_options

LOG = logging.getLogger(__name__)  # one line per call; ``retrieval-draft serve`` shows it (INFO)


def generate(*args, model, streamer=None, draft_streamer=None, **kwargs):
    """Run ``model.generate`` with ``retrieval_draft.generate`` as its decoding function.

    transformers passes ``model`` by keyword on both routes (a served model's ``generate`` is
    ``functools.partial(this, model=model)``), so the prompt may come first, by position.

    Args:
        model: the model ``generate`` was called on.
        args, kwargs: ``generate``'s arguments as the caller gave them (prompt ids,
            ``max_new_tokens``, ``generation_config``, sampling options, ``datastore=``, ...).
        streamer: HF's streamer (``put``/``end``): it receives the prompt, then every new token
            once, in order, then ``end()``.
        draft_streamer: the callable route's name for the same thing; give one of the two.

    Returns:
        what ``retrieval_draft.generate`` returns: shape (B, L + m) ids, or HF's
        ``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate=True``; for no new tokens,
        the prompt (B, L).
    """
    served = read_options(getattr(model, "name_or_path", "") or ".")
    kwargs = {**(served.generate_kwargs() if served is not None else {}), **kwargs}
    if kwargs.get("draft_stats") is None:  # the log line needs the call's statistics
        kwargs["draft_stats"] = DecodeStats()
    stats = kwargs["draft_stats"]
    started = time.perf_counter()
    try:
        if _new_tokens(model, kwargs) == 0:
            out = _read_only(model, args, one_streamer(streamer, draft_streamer, 1), kwargs)
        else:  # the callable takes HF's streamer as HF hands it on (``model.generate_kwargs``)
            out = GenerationMixin.generate(model, *args, custom_generate=retrieval_generate, streamer=streamer,
                                           draft_streamer=draft_streamer, **kwargs)
    except RetrievalDraftError as error:  # a server answers with its own error; its log says why in one line
        LOG.warning("refused: %s", error)
        raise
    LOG.info(_summary(stats, time.perf_counter() - started))
    return out


def _summary(stats: DecodeStats, seconds: float) -> str:
    """One call in a line: prompt tokens read and reused, new tokens, tokens per step, seconds."""
    steps = f", {stats.step_tokens / stats.steps:.2f} tokens per step" if stats.steps else ""
    return (f"{stats.reused_tokens + stats.prefilled_tokens} prompt tokens ({stats.reused_tokens} reused, "
            f"{stats.prefilled_tokens} read), {stats.new_tokens} new{steps}, {seconds:.2f} s")


def _new_tokens(model, kwargs: dict) -> int | None:
    """The call's ``max_new_tokens``: its keyword, else its generation config's, else the model's."""
    if kwargs.get("max_new_tokens") is not None:
        return kwargs["max_new_tokens"]
    config = kwargs.get("generation_config") or model.generation_config
    return getattr(config, "max_new_tokens", None)


def _read_only(model, args: tuple, streamer, kwargs: dict):
    """Prefill the prompt into the prefix cache; the streamer gets the prompt and ``end()``."""
    ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise InvalidInputError("a call for no new tokens takes its prompt as a (B, L) tensor of token ids")
    mask = kwargs.get("attention_mask")
    options = {name: kwargs[name] for name in ("draft_memory", "prefix_cache_bytes") if name in kwargs}
    kwargs["draft_stats"].__dict__.update(prefill(model, ids, mask, **options).__dict__)
    if streamer is not None:
        streamer.put(ids.cpu())
        streamer.end()
    config = kwargs.get("generation_config") or model.generation_config
    if kwargs.get("return_dict_in_generate", getattr(config, "return_dict_in_generate", False)):
        return GenerateDecoderOnlyOutput(sequences=ids)
    return ids
