"""Our decoding behind an HTTP server: ``retrieval-draft serve`` and the ``custom_generate`` folder.

- ``options``: the options a served model folder carries (``retrieval_draft.json``), checked once.
- ``folder``: lays out a model folder that ``transformers serve`` loads with our ``custom_generate/``.
- ``hub_route``: the ``generate`` that the folder's ``custom_generate/generate.py`` hands every call to
  (the Hub route, ``model.generate(custom_generate=FOLDER, trust_remote_code=True)``, runs it too).
- ``command``: the ``serve`` subcommand: check the options, lay out the folder, start ``transformers serve``.
- ``server_app``: what the command adds to HF's app: ``/infill`` (``infill``, ``fim``, ``editor_stops``),
  the stop of a generation whose client disconnects (``disconnect``) and, for both, each request's
  stopping criteria handed to its ``generate`` (``request_stops``).
- ``custom_generate/``: the two files of a Hub ``custom_generate`` folder (``hub/retrieval-draft`` links here).
"""
