"""Resident memory of an opened store, measured in a process of its own (``tools.bench.store_scale``).

    python -m tools.bench.store_memory STORE --warm-up SMALL_STORE --contexts CONTEXTS.npz

Prints one JSON object. The process first opens ``SMALL_STORE`` and runs the store drafters on
every context, so the query kernels are loaded and the interpreter's own memory is in place; then
reads its resident memory (``/proc/self/status``: VmRSS, RssAnon, RssFile), opens ``STORE`` (trusted:
no sha256), reads it again, runs the same drafters on every context of ``CONTEXTS.npz`` (each array
one context of token ids) and reads it a third time. The store's cost is the growth over the first
reading; ``mapped_bytes`` is what its files hold on disk (the Arrow files are memory-mapped, so the
pages a lookup touches count as RssFile; the trie is read into memory, RssAnon). Linux only.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import numpy as np

DRAFT_LEN = 8  # tokens each drafter proposes per context, as store_scale's lookup steps
MIB = 1 << 20


def resident() -> dict:
    """This process's resident memory in MiB: ``rss`` (VmRSS), ``anon`` (RssAnon), ``file`` (RssFile)."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    out = {}
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in fields:
                out[fields[name]] = round(int(value.split()[0]) / 1024, 1)  # kB -> MiB
    return out


def run_drafters(store, contexts: list[np.ndarray]) -> None:
    """Every store drafter proposes ``DRAFT_LEN`` tokens after each context."""
    from retrieval_draft.drafters.datastore import datastore_drafters

    drafters = datastore_drafters(store, vocab_size=store.vocab_size)
    for context in contexts:
        for drafter in drafters:
            drafter.propose(context, DRAFT_LEN)


def measure(path: Path, warm_up: Path, contexts: list[np.ndarray]) -> dict:
    """Resident memory (MiB) before opening ``path``, after opening it and after the lookups, the
    growth of each over the first, and the store's file bytes (module docstring)."""
    from retrieval_draft.store.opening import open_datastore

    run_drafters(open_datastore(warm_up, verify=False), contexts)
    gc.collect()
    before = resident()
    store = open_datastore(path, verify=False)
    opened = resident()
    run_drafters(store, contexts)
    looked_up = resident()
    mapped = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return {"before_mib": before, "opened_mib": opened, "after_lookups_mib": looked_up,
            "growth_opened_mib": round(opened["rss"] - before["rss"], 1),
            "growth_after_lookups_mib": round(looked_up["rss"] - before["rss"], 1),
            "anon_growth_mib": round(looked_up["anon"] - before["anon"], 1),
            "mapped_bytes": mapped, "mapped_mib": round(mapped / MIB, 1),
            "contexts": len(contexts)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("store", type=Path)
    p.add_argument("--warm-up", type=Path, required=True, help="a small store opened and queried first")
    p.add_argument("--contexts", type=Path, required=True, help=".npz of contexts (token id arrays)")
    args = p.parse_args(argv)
    with np.load(args.contexts) as saved:
        contexts = [saved[name] for name in saved.files]
    print(json.dumps(measure(args.store, args.warm_up, contexts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
