"""Numba query kernels behind the drafters: binary searches and draft expansion.

All take the query as int64 ids and write drafts into caller-owned output
arrays ``out_tok`` (P, L) int64, ``out_prob`` (P, L) float64, ``out_len``
(P,) int64, returning the number of drafts written. The suffix array comes
as ``words``/``bits`` (``retrieval_draft.store.packed``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from retrieval_draft.store.packed import position_at


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
def _count_from_suffixes(store, ctx, top_k, row_tok, row_cnt) -> int:
    """Top-k next ids of context ``ctx`` (n,) counted from the suffix array, into row_tok/row_cnt
    (count desc, then id asc; 0 = empty slot). Returns the continuations in total.

    ``store`` = (tokens, words, bits, sep, range_lo, range_hi, vocab_size); rows
    ``range_lo/hi[t]`` bound the suffixes starting with id t (format 3). The
    context's rows are one range sorted by their next id (separators last), so
    each next id is one run: the work is the range's length.
    """
    tokens, words, bits, sep, range_lo, range_hi, vocab_size = store
    n = ctx.size
    for k in range(top_k):
        row_tok[k] = 0
        row_cnt[k] = 0
    if ctx[0] < 0 or ctx[0] >= vocab_size:
        return 0
    s, e = narrow_range(tokens, words, bits, np.int64(range_lo[ctx[0]]), np.int64(range_hi[ctx[0]]), ctx)
    total = 0
    j = s
    while j < e:
        t = np.int64(tokens[position_at(words, bits, j) + n])
        if t == sep:
            break
        end = j + 1
        while end < e and np.int64(tokens[position_at(words, bits, end) + n]) == t:
            end += 1
        total += end - j
        insert_top_k(t, end - j, row_tok, row_cnt)
        j = end
    return total


@njit(cache=True)
def context_row(table, store, history, hlen, row_tok, row_cnt) -> int:
    """The row of the longest context (order <= max_order) ending history[:hlen] that has at
    least ``min_count`` continuations: its next ids and counts into row_tok/row_cnt (top_k,),
    returning its total (0: no context matches).

    ``table`` = (offsets, context, next, count, total, min_count, complete);
    ``store`` as ``_count_from_suffixes`` takes it. A context missing from an
    incomplete table is counted from the suffix array.
    """
    offsets, context, nxt, cnt, tot, min_count, complete = table
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
            total = _count_from_suffixes(store, ctx, row_tok.size, row_tok, row_cnt)
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
            h = 0
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


@njit(cache=True)
def suffix_drafts(tokens, words, bits, lo, hi, m, sep, samples, branches, pseudo, out_tok, out_prob, out_len) -> int:
    """Frequency-weighted continuations of a match of length ``m`` over sa[lo:hi].

    Reads up to ``samples`` occurrences spread evenly over the range (the
    range is sorted, so this is a stratified sample), stops each at a
    separator, then for each of the ``branches`` most frequent first tokens
    follows the majority token among the still-agreeing occurrences. Step
    probability = occurrences continuing that way / occurrences before the
    step, plus ``pseudo`` (unseen occurrences that shrink thin evidence). Ties
    go to the smaller id, so results are deterministic.
    """
    max_len = out_tok.shape[1]
    span = hi - lo
    s = min(span, samples)
    cont = np.empty((s, max_len), np.int64)
    clen = np.zeros(s, np.int64)
    for k in range(s):
        p = position_at(words, bits, lo + (k * span) // s) + m
        L = 0
        while L < max_len and p + L < tokens.size and tokens[p + L] != sep:
            cont[k, L] = tokens[p + L]
            L += 1
        clen[k] = L
    active = np.zeros(s, np.bool_)
    used = np.zeros(s, np.bool_)  # rows whose first token was already a branch
    n = 0
    while n < min(branches, out_tok.shape[0]):
        first, count = _majority(cont, clen, ~used, 0)
        if count == 0:
            break
        for k in range(s):
            active[k] = (not used[k]) and clen[k] > 0 and cont[k, 0] == first
            used[k] = used[k] or active[k]
        out_tok[n, 0] = first
        out_prob[n, 0] = count / (s + pseudo)
        depth = 1
        while depth < max_len:
            tok, c = _majority(cont, clen, active, depth)
            if c == 0:
                break
            live = 0
            for k in range(s):
                if active[k]:
                    live += 1
                    active[k] = clen[k] > depth and cont[k, depth] == tok
            out_tok[n, depth] = tok
            out_prob[n, depth] = c / (live + pseudo)
            depth += 1
        out_len[n] = depth
        n += 1
    return n


@njit(cache=True)
def _majority(cont, clen, mask, depth) -> tuple:
    """Most frequent id at ``depth`` among masked rows long enough (ties: smaller id); (id, count)."""
    ids = np.empty(cont.shape[0], np.int64)
    n = 0
    for k in range(cont.shape[0]):
        if mask[k] and clen[k] > depth:
            ids[n] = cont[k, depth]
            n += 1
    if n == 0:
        return -1, 0
    ids = np.sort(ids[:n])
    best, best_count = ids[0], 0
    run = 0
    for k in range(n):
        run = run + 1 if k > 0 and ids[k] == ids[k - 1] else 1
        if run > best_count:
            best, best_count = ids[k], run
    return best, best_count
