"""What the README, CI, a make target or the benchmark runs; each from the repository root as ``python -m tools.NAME``.

- ``bench/``: the benchmark harness (``python -m tools.bench``); every speed claim comes from it.
- ``diagnostics/step_profile``: host time per decode step, split by phase.
- ``demo``: the main job (``make demo``): write and edit code beside HF greedy.
- ``gpu_check``: exactness and speed of the plugin on a GPU (run where one is lent).
- ``hub_check``: the Hub-style ``custom_generate`` folder against the installed transformers (``make hub-check``).
- ``vllm_check``, ``vllm_engine``: our drafters as vLLM's proposer (``make vllm-check``).

The tools use the runtime's public API only; the runtime never imports them. Tests may import the tools.
"""
