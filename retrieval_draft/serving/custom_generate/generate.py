"""retrieval-draft as a model folder's ``generate``: this file holds no decoding code.

    model.generate(**inputs, custom_generate="path/to/hub/retrieval-draft", trust_remote_code=True)
    transformers serve FOLDER --trust-remote-code      (FOLDER laid out by `retrieval-draft serve`)

transformers executes this file and calls ``generate(model=model, **arguments)`` with all of
``generate``'s own arguments (``inputs``, ``generation_config``, ``streamer``, ...) and every
extra keyword, before any input preparation. The installed package does the rest
(``retrieval_draft.serving.hub_route.generate``): HF's ``streamer`` reaches the decoding,
the options a served folder carries are added, and a call for no new tokens fills the
prefix cache.
"""

# Inside ``try`` on purpose: transformers' import check skips it, so a missing package
# ends here with one line instead of a generic message or a failure deep in the import.
try:
    from retrieval_draft.serving.hub_route import generate  # noqa: F401  (transformers looks it up by name)
except ImportError:
    raise ImportError(
        "custom_generate 'retrieval-draft' needs the retrieval_draft package: pip install retrieval-draft"
    ) from None
