"""The ``retrieval-draft`` program's runtime commands (``retrieval_draft_datastore.cli`` adds the builder's).

- ``generate``: the ``generate`` subcommand (text in, text out) and ``run``, which prints our errors as one line.
- ``compare``: ``generate --compare``, the same request through plain ``generate`` beside ours.
- ``cache``: the ``cache`` subcommand, the cost curves and rates kept in the user cache.
"""
