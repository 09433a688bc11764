"""retrieval-draft through ``generate``'s Hub route: this file holds no decoding code.

    model.generate(**inputs, custom_generate="path/to/hub/retrieval-draft", trust_remote_code=True)

transformers executes this file and calls ``generate(model=model, **arguments)``, where
``arguments`` are all of ``generate``'s own (``inputs``, ``generation_config``,
``streamer``, ...) and every extra keyword argument, before any input preparation.
``generate`` below hands them back to ``GenerationMixin.generate`` with the installed
package's callable, ``retrieval_draft.generate``, so HF prepares the inputs as usual and
our options (``datastore=``, ``drafters=``, ``tree_budget=``, ...) reach the engine by
name. The one translation: the callable route drops HF's ``streamer``, so it travels as
``draft_streamer``.
"""

from transformers.generation.utils import GenerationMixin

# Inside ``try`` on purpose: transformers' import check skips it, so a missing package
# ends here with one line instead of a generic message or a failure deep in the import.
try:
    import retrieval_draft
    from retrieval_draft.errors import InvalidInputError
except ImportError:
    raise ImportError(
        "custom_generate 'retrieval-draft' needs the retrieval_draft package: pip install retrieval-draft"
    ) from None


def generate(model, *args, streamer=None, draft_streamer=None, **kwargs):
    """Run ``model.generate`` with ``retrieval_draft.generate`` as its decoding function.

    Args:
        model: the model ``generate`` was called on.
        args, kwargs: ``generate``'s arguments as the caller gave them (prompt ids,
            ``max_new_tokens``, sampling options, ``datastore=``, ``drafters=``, ...).
        streamer: HF's streamer (``put``/``end``, e.g. ``TextStreamer``); it receives the
            prompt, then every new token once, in order, then ``end()``.
        draft_streamer: the callable route's name for the same thing; give one of the two.

    Returns:
        what ``retrieval_draft.generate`` returns: shape (B, L + m) ids, or HF's
        ``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate=True``.
    """
    if streamer is not None and draft_streamer is not None:
        raise InvalidInputError("give one streamer: streamer= or draft_streamer=, not both")
    return GenerationMixin.generate(
        model,
        *args,
        custom_generate=retrieval_draft.generate,
        draft_streamer=streamer if streamer is not None else draft_streamer,
        **kwargs,
    )
