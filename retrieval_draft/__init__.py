"""retrieval-draft: faster generation for HuggingFace causal LMs, drafting from retrieval.

Drafters propose token continuations (prompt lookup, an n-gram table, a
suffix index); the target model verifies a whole tree of them in one forward
pass. Greedy output is token-identical to the model alone; sampling keeps the
model's distribution.
"""

from retrieval_draft.decode.engine import DecodeOptions, speculative_decode
from retrieval_draft.decode.stats import DecodeStats
from retrieval_draft.errors import RetrievalDraftError
from retrieval_draft.hf import generate, open_datastore
from retrieval_draft.memory import PROCESS_MEMORY, PluginMemory

__all__ = (
    "DecodeOptions",
    "DecodeStats",
    "PROCESS_MEMORY",
    "PluginMemory",
    "RetrievalDraftError",
    "generate",
    "open_datastore",
    "speculative_decode",
)
__version__ = "0.1.0"
