"""Checks that a person or CI runs against a model, a device or a store.

- ``model_coverage``: every causal-LM architecture of the installed transformers as a tiny model,
  decoded through the plugin against plain ``generate`` (``model_zoo``, ``zoo_sizes``, ``zoo_check``:
  the tiny models and the check, shared with ``tests/model/test_model_coverage.py``).
- ``datastore_numbers``: datastore build and drafting numbers on real corpora.

``tools.gpu_check`` and ``tools.hub_check`` stay at the top of tools/: they are documented commands.
"""
