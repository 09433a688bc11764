"""The benchmark harness: every speed claim comes from it (``python -m tools.bench``).

- ``run``: the harness itself (``python -m tools.bench`` runs it).
- ``systems``: the systems compared (plain HF, HF prompt lookup, the README's calls, SuffixDecoding).
- ``workloads``, ``text_workloads``, ``repo_workloads``: the prompts.
- ``exactness``: the reduced-precision rule; outputs that part from plain greedy judged by it.
- ``report``: metrics, tables and chart.
- ``cache_state``: what the user cache held when a run began (``--cache fresh``: an empty one).
- ``fresh`` and ``first_call``: first calls in new processes.
- ``peers``: SuffixDecoding built from its sources, drafting in our engine.
- ``http_sessions``, ``http_servers``, ``session_workloads``: an editor and a chat client over HTTP,
  against servers started by ``retrieval-draft serve`` (``python -m tools.bench.http_sessions``).
- ``store_scale``, ``scale_corpus``: stores of growing size from this machine's Python sources: build,
  open and lookup cost, accepted tokens per step (``python -m tools.bench.store_scale``).
- ``vllm``: our proposer inside vLLM against its own methods (``python -m tools.bench.vllm``).
"""
