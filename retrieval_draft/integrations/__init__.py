"""Adapters that let serving engines draft with this project's drafters (``vllm_proposer``).

Outside the runtime core: nothing under ``decode/``, ``planning/``, ``model/`` or ``drafters/``
imports from here, and a module here imports its engine only where it needs it.
"""
