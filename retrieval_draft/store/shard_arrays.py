"""The arrays the query kernels read, gathered from a store's shards (one shard for a flat store).

``shard_arrays(shards, sep, vocab_size)`` returns the tuple every kernel of
``query`` and ``suffix_query`` takes as ``store``::

    (tokens, words, bits, first_lo, first_hi, sep, vocab_size)

``tokens``: typed List of each shard's (T_i,) uint16/uint32 stream;
``words``: typed List of its packed suffix array ((W_i,) uint32, ``packed``);
``bits``: (S,) int64 position widths; ``first_lo``/``first_hi``: typed Lists of
(vocab_size,) uint32, the suffix-array rows of shard i starting with id t are
first_lo[i][t]:first_hi[i][t]. Typed Lists (not tuples) so that one compiled
kernel serves every shard count. Shard order is stream order.
"""

from __future__ import annotations

import numpy as np
from numba import typed


def shard_arrays(shards, sep: int, vocab_size: int) -> tuple:
    """The kernels' ``store`` tuple for ``shards`` (each a ``reader.Datastore``)."""
    ranges = [shard.first_ranges() for shard in shards]
    return (
        typed.List([shard.tokens for shard in shards]),
        typed.List([shard.suffix_words for shard in shards]),
        np.array([shard.position_bits for shard in shards], np.int64),
        typed.List([lo for lo, _ in ranges]),
        typed.List([hi for _, hi in ranges]),
        int(sep),
        int(vocab_size),
    )
