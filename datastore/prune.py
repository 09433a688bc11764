"""Drop n-gram rows that can never change a draft.

The n-gram drafter looks a context up longest first: when the row of
context ``(a, c1..cn)`` is missing it uses the row of ``(c1..cn)``, its
parent. A row whose next ids, counts and total equal its parent's therefore
gives exactly the drafts its parent gives, and is dropped. Equality is
transitive, so a row equal to a parent that is itself dropped still falls
through to an equal row. Order-1 rows have no parent and are all kept.
(On the stdlib + site-packages corpus most order-3 and order-4 contexts
continue exactly like their suffix.)
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _equal_to_parent(ctx, nxt, cnt, tot, pctx, pnxt, pcnt, ptot) -> np.ndarray:
    """keep[r] = False when row r (context ctx[r], order n) equals its parent row in pctx (order n-1)."""
    rows, n = ctx.shape
    keep = np.ones(rows, np.bool_)
    for r in range(rows):
        a, b = 0, pctx.shape[0]
        found = -1
        while a < b:  # binary search for ctx[r, 1:] among the sorted parent contexts
            mid = (a + b) // 2
            cmp = 0
            for k in range(n - 1):
                if pctx[mid, k] != ctx[r, k + 1]:
                    cmp = -1 if pctx[mid, k] < ctx[r, k + 1] else 1
                    break
            if cmp == 0:
                found = mid
                break
            if cmp < 0:
                a = mid + 1
            else:
                b = mid
        if found < 0 or tot[r] != ptot[found]:
            continue
        same = True
        for k in range(nxt.shape[1]):
            if nxt[r, k] != pnxt[found, k] or cnt[r, k] != pcnt[found, k]:
                same = False
                break
        keep[r] = not same
    return keep


def prune_ngrams(per_order: list[tuple]) -> list[tuple]:
    """``per_order[n-1] = (ctx (R, n), nxt (R, K), cnt (R, K), tot (R,))`` without the rows
    equal to their parent (decided against the unpruned parent table)."""
    kept = [per_order[0]]
    for n in range(2, len(per_order) + 1):
        ctx, nxt, cnt, tot = per_order[n - 1]
        keep = _equal_to_parent(ctx, nxt, cnt, tot, *per_order[n - 2])
        kept.append((ctx[keep], nxt[keep], cnt[keep], tot[keep]))
    return kept
