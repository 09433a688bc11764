"""Measurement and tuning tools; each runs from the repository root as ``python -m tools.NAME``.

- ``bench/``: the benchmark harness (``python -m tools.bench``); every speed claim comes from it.
- ``diagnostics/``: where a step's time and tokens go (``python -m tools.diagnostics.step_profile``, ...).
- ``checks/``: model coverage and datastore numbers.
- ``demo``: the main job (``make demo``): write and edit code beside HF greedy.
- ``gpu_check``: exactness and speed of the plugin on a GPU (run where one is lent).
- ``hub_check``: the Hub-style ``custom_generate`` folder against the installed transformers (``make hub-check``).

The tools use the runtime's public API only; the runtime never imports them. Tests may import the tools.
"""
