"""Tokenizer identity for datastores: vocabulary size and fingerprint.

Loading lives in ``retrieval_draft.model.models.load_tokenizer``.
"""

from __future__ import annotations

import hashlib
import json


def tokenizer_vocab_size(tokenizer) -> int:
    """Number of ids the tokenizer can emit (base vocabulary plus added tokens)."""
    return max(len(tokenizer), int(getattr(tokenizer, "vocab_size", 0) or 0))


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 hex over the vocabulary items sorted by id, then token, and the special token ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    special = sorted(int(i) for i in tokenizer.all_special_ids)
    payload = json.dumps({"vocab": vocab, "special_ids": special}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
