"""Suffix-array positions packed at the width the stream needs.

A stream of n tokens has positions 0..n-1, which need ``position_bits(n)``
bits (27 for 104M tokens) instead of 32. Format 3 stores them as a
little-endian bit stream in uint32 words, value i at bits
[i * bits, (i + 1) * bits), plus one zero word of padding so a read may
always load two words. Stores of format 1 and 2 hold plain uint32
positions: the same kernels read them as ``bits == 32``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def position_bits(n_tokens: int) -> int:
    """Bits that hold every position of a stream of ``n_tokens`` (>= 1) tokens."""
    return max(1, int(n_tokens - 1).bit_length())


def packed_words(n_values: int, bits: int) -> int:
    """Length of the uint32 word array ``pack_positions`` writes: ``n_values`` values of ``bits`` bits, plus padding."""
    return (n_values * bits + 31) // 32 + 1


@njit(cache=True, inline="always")
def position_at(words: np.ndarray, bits: int, i: int) -> np.int64:
    """Value ``i`` of a packed array (``words`` (W,) uint32, ``bits`` per value)."""
    if bits == 32:
        return np.int64(words[i])
    bit = np.int64(i) * bits
    w = bit >> 5
    pair = np.uint64(words[w]) | (np.uint64(words[w + 1]) << np.uint64(32))
    return np.int64((pair >> np.uint64(bit & 31)) & np.uint64((1 << bits) - 1))


def pack_positions(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` (n,) uint32, each < 2**bits, as packed words (``packed_words(n, bits)``,) uint32."""
    out = np.zeros(packed_words(values.size, bits), np.uint32)
    _pack_into(values, bits, out)
    return out


@njit(cache=True)
def _pack_into(values: np.ndarray, bits: int, out: np.ndarray) -> None:
    """Or ``values`` into the zeroed words ``out`` at ``bits`` bits each."""
    mask = np.uint64((1 << bits) - 1)
    for i in range(values.size):
        bit = np.int64(i) * bits
        w = bit >> 5
        shifted = (np.uint64(values[i]) & mask) << np.uint64(bit & 31)
        out[w] |= np.uint32(shifted & np.uint64(0xFFFFFFFF))
        out[w + 1] |= np.uint32(shifted >> np.uint64(32))


@njit(cache=True)
def unpack_positions(words: np.ndarray, bits: int, n: int) -> np.ndarray:
    """The ``n`` values of a packed array as (n,) uint32."""
    out = np.empty(n, np.uint32)
    for i in range(n):
        out[i] = position_at(words, bits, i)
    return out


@njit(cache=True)
def max_position(words: np.ndarray, bits: int, n: int) -> np.int64:
    """Largest of the ``n`` values (-1 when n == 0): one pass, no unpacked copy."""
    best = np.int64(-1)
    for i in range(n):
        v = position_at(words, bits, i)
        if v > best:
            best = v
    return best
