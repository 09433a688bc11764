"""Adapting an HF causal LM for tree verification: the only code that touches transformers and torch-module internals.

Tree forwards and KV compaction (``tree_model``), the in-place KV cache (``kv_cache``),
grouped-query tree attention (``tree_attention``), the CPU skinny matmul
(``skinny_linear``), model loading (``models``) and ``generate``'s argument plumbing
(``generate_kwargs``).
"""
