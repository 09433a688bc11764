"""retrieval-draft: faster generation for HuggingFace causal LMs, drafting from retrieval.

Drafters propose token continuations (prompt lookup, an n-gram table, a
suffix index); the target model verifies a whole tree of them in one forward
pass. Greedy output is token-identical to the model alone; sampling keeps the
model's distribution.

The names below are imported on first use (PEP 562), so a process that reads
or builds a datastore (``retrieval_draft.store``, the builder, its Ray
workers) does not import torch and transformers (about 6 s on 2 cores).
"""

from __future__ import annotations

import importlib

_EXPORTS = (  # (public name, the module that defines it)
    ("DecodeOptions", "retrieval_draft.decode.engine"),
    ("speculative_decode", "retrieval_draft.decode.engine"),
    ("DecodeStats", "retrieval_draft.decode.engine"),
    ("CorruptDatastoreError", "retrieval_draft.errors"),
    ("CorruptHistoryError", "retrieval_draft.errors"),
    ("CorruptRecyclingTableError", "retrieval_draft.errors"),
    ("DatastoreError", "retrieval_draft.errors"),
    ("DatastoreNotFoundError", "retrieval_draft.errors"),
    ("EmptyCorpusError", "retrieval_draft.errors"),
    ("InvalidInputError", "retrieval_draft.errors"),
    ("ModelLoadError", "retrieval_draft.errors"),
    ("NoFillInMiddleError", "retrieval_draft.errors"),
    ("RetrievalDraftError", "retrieval_draft.errors"),
    ("TokenIdOutOfRangeError", "retrieval_draft.errors"),
    ("TokenizerMismatchError", "retrieval_draft.errors"),
    ("UnknownFormatVersionError", "retrieval_draft.errors"),
    ("UnsupportedModelError", "retrieval_draft.errors"),
    ("generate", "retrieval_draft.plugin.hf"),
    ("open_datastore", "retrieval_draft.plugin.hf"),
    ("prefill", "retrieval_draft.plugin.hf"),
    ("PROCESS_MEMORY", "retrieval_draft.sessions.memory"),
    ("PluginMemory", "retrieval_draft.sessions.memory"),
)

__all__ = tuple(sorted(name for name, _ in _EXPORTS))
__version__ = "0.1.0"


def __getattr__(name: str):
    """The public name ``name``, imported from its module (Python keeps the module after the first time)."""
    for public, module in _EXPORTS:
        if public == name:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'retrieval_draft' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
