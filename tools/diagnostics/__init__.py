"""Diagnostics: where time and tokens go. Estimates for tuning, not speed claims (those come from ``tools.bench``).

- ``step_profile``: host time per decode step, split by phase.
- ``forward_cost``: forward cost by tree size with the CPU paths switched on one by one.
- ``forward_kernels``: the kernels (GPU) or operators (CPU) a tree forward runs beyond a lone root's.
- ``acceptance_ceiling``: tokens per step idealised drafters would reach on open text.
- ``replay``: saved greedy outputs through the engine with a stand-in model (no forwards).
- ``fit_priors``: prompt lookup's acceptance by match length on held-out prompts.
- ``warm_history``: fills and saves an output history from held-out requests.
- ``layer_skip``: self-speculation with skipped layers, measured.
"""
