"""The benchmark harness: every speed claim comes from it (``python -m tools.bench``).

- ``run``: the harness itself (``python -m tools.bench`` runs it).
- ``systems``: the systems compared (plain HF, HF prompt lookup, the README's calls).
- ``workloads``, ``text_workloads``, ``repo_workloads``: the prompts.
- ``exactness``: in bfloat16 / float16, outputs that part from plain greedy judged by the near-tie rule.
- ``report``: metrics, tables and chart; ``python -m tools.bench.report RESULT.json`` re-renders one.
- ``fresh`` and ``first_call``: first calls in new processes.
- ``batch``: batches of 1..16 rows (``python -m tools.bench.batch``).
- ``store_scale``: drafting time, build throughput and memory against store size and shard count.
- ``versions``: two checkouts' harnesses interleaved (``python -m tools.bench.versions``).
- ``sessions``, ``session_workloads``: an editor and a chat client in one process (``python -m tools.bench.sessions``).
- ``http_sessions``, ``http_servers``: the same sessions over HTTP, against servers started by
  ``retrieval-draft serve`` (``python -m tools.bench.http_sessions``).
"""
