"""Numba query kernels behind the drafters: binary searches and draft expansion.

All take the query as int64 ids and write drafts into caller-owned output
arrays ``out_tok`` (P, L) int64, ``out_prob`` (P, L) float64, ``out_len``
(P,) int64, returning the number of drafts written. A store comes as the
``shard_arrays`` tuple (one entry per shard; a flat store is one shard); one
suffix array as ``words``/``bits`` (``retrieval_draft.store.packed``). The
suffix drafter's kernels are in ``suffix_query``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retrieval_draft.store.packed import position_at
from retrieval_draft.store.rare_filter import context_hash, may_contain


@njit(cache=True)
def _compare_suffix(tokens, pos, query, m) -> int:
    """Compare tokens[pos:pos+m] with query[:m]: -1, 0 or 1 (the stream is separator-terminated)."""
    for k in range(m):
        t = np.int64(tokens[pos + k])
        if t != query[k]:
            return -1 if t < query[k] else 1
    return 0


@njit(cache=True)
def narrow_range(tokens, words, bits, lo, hi, query) -> tuple:
    """Sub-range of sa[lo:hi] whose suffixes start with ``query`` (shape (m,), int64)."""
    m = query.size
    a, b = lo, hi
    while a < b:  # first suffix >= query
        mid = (a + b) // 2
        if _compare_suffix(tokens, position_at(words, bits, mid), query, m) < 0:
            a = mid + 1
        else:
            b = mid
    start = a
    if a == hi or _compare_suffix(tokens, position_at(words, bits, a), query, m) != 0:
        return start, start  # no suffix starts with the query: the second search would find nothing
    b = hi
    while a < b:  # first suffix > query (on its first m tokens)
        mid = (a + b) // 2
        if _compare_suffix(tokens, position_at(words, bits, mid), query, m) <= 0:
            a = mid + 1
        else:
            b = mid
    return start, a


@njit(cache=True)
def _find_context(context, rows_lo, rows_hi, query) -> int:
    """Row in context[rows_lo:rows_hi] (contexts of order n = query.size) equal to ``query``, or -1."""
    n = query.size
    a, b = rows_lo, rows_hi
    while a < b:
        mid = (a + b) // 2
        cmp = 0
        for k in range(n):
            c = np.int64(context[mid, k])
            if c != query[k]:
                cmp = -1 if c < query[k] else 1
                break
        if cmp == 0:
            return mid
        if cmp < 0:
            a = mid + 1
        else:
            b = mid
    return -1


@njit(cache=True, nogil=True)
def insert_top_k(token, count, out_tok, out_cnt) -> None:
    """Insert (token, count) into out_tok/out_cnt (k,), kept sorted by count descending; among
    equal counts the one inserted first stays first (runs come in id order, so the smaller id);
    a count below the k-th is dropped."""
    top_k = out_tok.size
    slot = top_k
    while slot > 0 and count > out_cnt[slot - 1]:
        slot -= 1
    if slot < top_k:
        for k in range(top_k - 1, slot, -1):
            out_tok[k] = out_tok[k - 1]
            out_cnt[k] = out_cnt[k - 1]
        out_tok[slot] = token
        out_cnt[slot] = count


@njit(cache=True)
def _shard_runs(store, i, ctx, ids, cnts, m) -> tuple:
    """Append (next id, count) of every run of context ``ctx`` (n,) in shard ``i``'s suffix array
    to ``ids``/``cnts`` from index ``m`` (growing them when full). Runs come in id order (the
    context's rows are one range sorted by their next id, separators last), so the work is the
    range's length. Returns (ids, cnts, m)."""
    tokens_l, words_l, bits_l, first_lo, first_hi, sep, vocab_size = store
    tokens, words, bits = tokens_l[i], words_l[i], bits_l[i]
    n = ctx.size
    s, e = narrow_range(tokens, words, bits, np.int64(first_lo[i][ctx[0]]), np.int64(first_hi[i][ctx[0]]), ctx)
    j = s
    while j < e:
        t = np.int64(tokens[position_at(words, bits, j) + n])
        if t == sep:
            break
        end = j + 1
        while end < e and np.int64(tokens[position_at(words, bits, end) + n]) == t:
            end += 1
        if m == ids.size:
            ids = np.concatenate((ids, np.empty(ids.size, np.int64)))
            cnts = np.concatenate((cnts, np.empty(cnts.size, np.int64)))
        ids[m] = t
        cnts[m] = end - j
        m += 1
        j = end
    return ids, cnts, m


@njit(cache=True)
def count_from_suffixes(store, ctx, top_k, row_tok, row_cnt, rare, rare_off) -> int:
    """Top-k next ids of context ``ctx`` (n,) counted from the suffix arrays of every shard, into
    row_tok/row_cnt (count desc, then id asc; 0 = empty slot). Returns the continuations in total.

    ``store``: the ``shard_arrays`` tuple. Each shard's runs are counted, then the counts of one
    id are summed across shards and inserted in id order: exactly what one suffix array over the
    shards' documents laid end to end gives (its run of an id is the shards' runs together).
    ``rare``/``rare_off``: the shards' rare-context filters (``NgramTable``); a shard whose filter
    rules the context out is skipped (empty ``rare_off``: no filters, every shard is searched).
    """
    vocab_size = store[6]
    for k in range(top_k):
        row_tok[k] = 0
        row_cnt[k] = 0
    if ctx[0] < 0 or ctx[0] >= vocab_size:
        return 0
    ids = np.empty(64, np.int64)
    cnts = np.empty(64, np.int64)
    m = np.int64(0)  # typed, not Literal[int](0): one compiled _shard_runs
    h = context_hash(ctx) if rare_off.size else np.uint64(0)
    for i in range(len(store[0])):
        if rare_off.size and not may_contain(rare[rare_off[i] : rare_off[i + 1]], h):
            continue  # shard i holds no row of this context (a filter has no false negatives)
        ids, cnts, m = _shard_runs(store, i, ctx, ids, cnts, m)
    order = np.argsort(ids[:m], kind="mergesort") if len(store[0]) > 1 else np.arange(m)
    total = 0
    k = 0
    while k < m:
        t = ids[order[k]]
        c = 0
        while k < m and ids[order[k]] == t:
            c += cnts[order[k]]
            k += 1
        total += c
        insert_top_k(t, c, row_tok, row_cnt)
    return total


@njit(cache=True)
def context_row(table, store, history, hlen, row_tok, row_cnt) -> int:
    """The row of the longest context (order <= max_order) ending history[:hlen] that has at
    least ``min_count`` continuations: its next ids and counts into row_tok/row_cnt (top_k,),
    returning its total (0: no context matches).

    ``table`` = (offsets, context, next, count, total, min_count, complete, rare_filter, rare_offsets)
    (``NgramTable.as_kernel_tuple``);
    ``store`` as ``count_from_suffixes`` takes it. A context missing from an
    incomplete table is counted from the suffix arrays of every shard.

    The rule that makes a sharded store draft exactly as one index over the same
    documents: a sharded store's table is the whole corpus's table (the builder
    counts each context across all shards, ``shard_table``), so a context is in it
    exactly when it would be in a one-shard store's, with the same top-k, counts and
    total; a context missing from it has fewer than ``table_min_total``
    continuations in the whole corpus and is counted from every shard's suffix array,
    its runs summed per id (``count_from_suffixes``), skipping the shards whose rare-context
    filter rules it out (no row of a drafting rare context there: ``rare_filter``).
    """
    offsets, context, nxt, cnt, tot, min_count, complete, rare, rare_off = table
    max_order = offsets.size - 2
    for n in range(min(max_order, hlen), 0, -1):
        ctx = history[hlen - n : hlen]
        row = _find_context(context, offsets[n], offsets[n + 1], ctx)
        if row >= 0:
            for k in range(row_tok.size):
                row_tok[k] = nxt[row, k]
                row_cnt[k] = cnt[row, k]
            return np.int64(tot[row])
        if not complete:
            total = count_from_suffixes(store, ctx, row_tok.size, row_tok, row_cnt, rare, rare_off)
            if total >= min_count and total > 0:
                return total
    return 0


@njit(cache=True)
def ngram_drafts(query, table, store, widths, pseudo, out_tok, out_prob, out_len) -> int:
    """Expand the Markov model into a tree of paths; each leaf path is one draft.

    ``query``: last max_order context ids; ``table``/``store`` as ``context_row``
    takes them. ``widths[d]``: children kept at depth d (len(widths) = max
    draft length). Probabilities are count / (total + ``pseudo``) of the
    matched context: ``pseudo`` unseen observations shrink estimates backed
    by few counts (a context seen once does not promise 1.0). Paths end
    where no context matches.
    """
    offsets = table[0]
    top_k = table[2].shape[1]
    max_order = offsets.size - 2
    max_len = widths.size
    n_paths = 1
    out_len[0] = 0
    history = np.empty(max_order + max_len, np.int64)
    row_tok = np.zeros(top_k, np.int64)
    row_cnt = np.zeros(top_k, np.int64)
    for depth in range(max_len):
        frontier = n_paths
        for p in range(frontier):
            if out_len[p] != depth:
                continue
            q0 = max(0, query.size - max_order + depth)
            h = np.int64(0)  # typed, not Literal[int](0): one compiled context_row
            for k in range(q0, query.size):
                history[h] = query[k]
                h += 1
            for k in range(depth):
                history[h] = out_tok[p, k]
                h += 1
            total = context_row(table, store, history, h, row_tok, row_cnt)
            if total == 0:
                continue
            kids = 0
            for c in range(top_k):
                if kids >= widths[depth] or row_cnt[c] == 0:
                    break
                target = p
                if kids > 0:
                    if n_paths >= out_tok.shape[0]:
                        break
                    target = n_paths
                    n_paths += 1
                    out_tok[target, :depth] = out_tok[p, :depth]
                    out_prob[target, :depth] = out_prob[p, :depth]
                out_tok[target, depth] = row_tok[c]
                out_prob[target, depth] = row_cnt[c] / (total + pseudo)
                out_len[target] = depth + 1
                kids += 1
    return n_paths if out_len[0] > 0 else 0
