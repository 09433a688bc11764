"""Measurement and tuning tools; each runs from the repository root as ``python -m tools.NAME``.

- ``bench``: the benchmark harness; every speed claim comes from it
  (``bench_systems``: the systems compared, ``bench_workloads``: the prompts,
  ``bench_report``: metrics, tables and chart, ``bench_fresh``: first calls in
  new processes, each one a run of ``first_call``).
- ``bench_report``: re-renders a saved benchmark JSON.
- ``first_call``: one ``model.generate`` call as the first call of a fresh process.
- ``demo``: the main job (``make demo``): write and edit code beside HF greedy.
- ``fit_priors``: prompt lookup's acceptance by match length on held-out prompts.
- ``warm_history``: fills and saves an output history from held-out requests.
- ``replay``: replays saved greedy outputs through the engine with a stand-in
  model (no forward passes): tuning estimates from a cost curve.
- ``forward_cost``: forward cost by tree size with the CPU paths switched on one by one.
- ``step_profile``: where a decode step's time goes.
- ``datastore_numbers``: datastore build and drafting numbers on real corpora.

The tools use the runtime's public API only; the runtime never imports them.
"""
