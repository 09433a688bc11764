"""The suffix index's router: a datrie from encoded n-grams to suffix-array ranges.

Design (measured; see docs/datastores.md, and the check that measured it: `git show 8f31bf5:tools/checks/datastore_numbers.py`):

* The token stream (Arrow uint16/uint32, 2 or 4 B/token) and a suffix array
  (packed positions, 27 bits/token at 104M tokens) sorted to ``sort_depth`` tokens hold every
  occurrence of every context, so continuations are read from the corpus
  itself and weighted by how often they occur (REST's idea).
* The datrie holds only short keys: every unigram and every n-gram of order
  2..trie_depth that occurs >= ``trie_min_count`` times, each mapping to a
  row of ``suffix_ranges`` (lo, hi): in format 3 the unigram of id t maps to
  row t (rows 0..vocab-1 are every id's first-token range, which the n-gram
  drafter's Numba kernels read directly), longer keys to the rows after. The
  trie only routes a query to a range that the binary search then narrows,
  so fewer keys change speed, never results: datrie's insertion slows as it
  grows (641k keys took 20 s, 31 us/key; 168k keys take about 1.3 s), so the
  builder keeps bigrams seen >= 64 times.
* A query finds the deepest key that prefixes the context suffix with one
  ``longest_prefix_value`` call, then narrows that range with a Numba
  binary search over the suffix array to the full match length.

Key encoding: datrie's alphabet holds at most 255 symbols, so each id is
written as ``width`` base-64 digits over chr(1)..chr(64), most significant
first (3 digits cover 262,144 ids). Base 64 rather than 255: libdatrie's
insert cost grows with the alphabet size; on 224k stdlib keys base 255
took 73 us/key, base 64 7.9 us/key, base 16 20 us/key (longer keys). Fixed width keeps every key token-aligned and makes lexicographic
order of keys equal lexicographic order of id sequences, so keys produced in
suffix-array order are inserted sorted (200k random keys: 141 s unsorted vs
1.7 s sorted).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retrieval_draft.atomic import atomic_path

if TYPE_CHECKING:  # datrie is imported where a trie is built or loaded: sessions without a store run without it
    import datrie

BASE = 64
ALPHABET_RANGE = (chr(1), chr(BASE))


def key_width(vocab_size: int) -> int:
    """Digits per id so that every id < vocab_size is encodable (BASE**width >= vocab_size)."""
    width = 1
    while BASE**width < vocab_size:
        width += 1
    return width


def encode_ids(ids, width: int) -> str:
    """Encode a short id sequence (ints < BASE**width) as a trie key."""
    chars = []
    for token in ids:
        token = int(token)
        digits = []
        for _ in range(width):
            digits.append(chr(token % BASE + 1))
            token //= BASE
        chars.extend(reversed(digits))
    return "".join(chars)


def encode_rows(ids: np.ndarray, lengths: np.ndarray, width: int) -> list[str]:
    """Encode row r's first lengths[r] ids of ``ids`` (shape (R, D)) as keys, vectorised."""
    rows, depth = ids.shape
    codes = np.zeros((rows, depth * width), np.uint32)
    values = ids.astype(np.int64)
    for digit in range(width):
        place = BASE ** (width - 1 - digit)
        codes[:, digit::width] = (values // place) % BASE + 1
    for d in range(depth):  # zero code points past a key's length; numpy strips trailing NULs
        codes[lengths <= d, d * width : (d + 1) * width] = 0
    return np.ascontiguousarray(codes).view(f"<U{depth * width}").reshape(rows).tolist()


def build_trie(keys: list[str], rows: np.ndarray, path: Path) -> None:
    """Insert ``keys[i] -> rows[i]`` (keys already sorted) into a BaseTrie and save it to ``path``."""
    import datrie

    trie = datrie.BaseTrie(ranges=[ALPHABET_RANGE])
    for key, row in zip(keys, rows.tolist()):
        trie[key] = row
    with atomic_path(path) as tmp:
        trie.save(str(tmp))


def load_trie(path: Path) -> datrie.BaseTrie:
    """Load a BaseTrie. Call only after the file's sha256 was verified (corrupt tries can segfault)."""
    import datrie

    return datrie.BaseTrie.load(str(path))
