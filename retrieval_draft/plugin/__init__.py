"""The ``custom_generate`` plugin: ``generate``'s keywords in, one decode, HF's output out.

- ``hf``: ``generate`` (the callable HF's ``generate`` hands the call to), ``prefill`` and ``open_datastore``.
- ``keywords``: our keywords (drafters, stores, sizes, memory) checked once, before any model work.
- ``hf_options``: HF's own options we honour or refuse, and the output class HF's callers expect.
"""
