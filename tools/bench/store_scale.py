"""Scale benchmark for sharded stores: drafting time per step, build throughput and peak memory
against store size and shard count, plus a projection to 1B and 10B tokens.

Corpus: the largest real one on this machine, the standard library plus this venv's site-packages,
tokenised once with the SmolLM2 tokenizer into ``.cache/store_scale/stream-uint16.bin`` (the *.py
files, then the *.pyi/*.h/*.c/*.hpp/*.cpp files). Each size is the stream's first N tokens cut at a
document end; each (size, shard count) store is built in a child process from those tokens (so the
build numbers are indexing only, tokenising excluded, and peak RSS is the build's own), then opened
here and timed on the same contexts: one step = the store's n-gram and suffix drafters proposing
8 tokens after a 64-token context taken from the store's own stream. Drafts of every shard count are
compared with the one-shard store's of the same size.

Usage: python -m tools.bench.store_scale [--sizes 10M,20M,40M,full] [--shards 1,4,16] [--contexts 1000]
Writes bench/results/DATE-cpu2-store-scale.json and .png (atomic), prints a markdown table.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from retrieval_draft.atomic import atomic_write_bytes

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "store_scale"
RESULTS = REPO / "bench" / "results"
PASSES = (("*.py",), ("*.pyi", "*.h", "*.c", "*.hpp", "*.cpp"))  # tokenised in this order, concatenated
SEP = 0xFFFF  # the SmolLM2 vocabulary fits uint16: separator 65535
REPEATS = 3
BLOCK = 1 << 24  # tokens read per chunk while building

BUILD_CHILD = """
import json, resource, sys, time
from pathlib import Path
import numpy as np
from tools.bench.store_scale import doc_chunks
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.shard_build import build_sharded_from_chunks
stream, size, shard_tokens, out, fingerprint, vocab, table_min = sys.argv[1:8]
start = time.perf_counter()
m = build_sharded_from_chunks(doc_chunks(Path(stream), int(size)), Path(out), {"vocab_size": int(vocab), "fingerprint": fingerprint},
                              np.dtype(np.uint16), IndexParams(table_min_total=int(table_min)), int(shard_tokens))
wall = time.perf_counter() - start
print(json.dumps({"wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "stats": m["stats"], "max_shard_tokens": max(s["tokens"] for s in m["shards"])}))
"""


def corpus_stream() -> Path:
    """The tokenised corpus (uint16 ids, documents separator-terminated), tokenising it on first use."""
    target = CACHE / "stream-uint16.bin"
    if target.exists():
        return target
    from retrieval_draft.store.layout import separator_id, token_dtype
    from retrieval_draft.store.tokenizer import tokenizer_vocab_size
    from retrieval_draft.model.models import load_tokenizer
    from retrieval_draft_datastore.encode import encode_chunks
    from retrieval_draft_datastore.sources import SourceOptions, iter_documents
    from tools.datastore_numbers import stdlib_sources

    tokenizer = load_tokenizer()
    vocab = tokenizer_vocab_size(tokenizer)
    dtype = token_dtype(vocab)
    sources = stdlib_sources() + [sysconfig.get_paths()["purelib"]]
    CACHE.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    for globs in PASSES:
        docs = iter_documents(sources, SourceOptions(globs=globs))
        for chunk in encode_chunks(docs, tokenizer, dtype=dtype, sep=separator_id(dtype), vocab_size=vocab):
            buffer.write(chunk.tobytes())
    atomic_write_bytes(target, buffer.getvalue())
    return target


def doc_chunks(stream: Path, limit: int):
    """Chunks (uint16 arrays of whole documents) of the stream's first ``limit`` tokens, cut at the
    last document end within the limit; reads BLOCK tokens at a time."""
    total = min(limit, stream.stat().st_size // 2)
    offset, carry = 0, np.zeros(0, np.uint16)
    while offset < total:
        block = np.fromfile(stream, np.uint16, count=min(BLOCK, total - offset), offset=offset * 2)
        offset += block.size
        block = np.concatenate([carry, block])
        ends = np.flatnonzero(block == SEP)
        cut = int(ends[-1]) + 1 if ends.size else 0
        carry = block[cut:]
        if cut:
            yield block[:cut]


def sample_contexts(stream: Path, size: int, count: int, length: int = 64, seed: int = 0) -> list[np.ndarray]:
    """``count`` windows of ``length`` ids inside one document of the stream's first ``size`` tokens."""
    tokens = np.memmap(stream, np.uint16, mode="r")[: size]
    rng = np.random.default_rng(seed)
    found = []
    while len(found) < count:
        p = int(rng.integers(length, size - 1))
        window = np.asarray(tokens[p - length : p], np.int64)
        if not np.any(window == SEP):
            found.append(window)
    return found


def build_store(stream: Path, size: int, shards: int, out: Path, header: dict, table_min: int) -> dict:
    """Build one store in a child process; its wall seconds, peak RSS, manifest stats.
    ``header``: vocab_size, fingerprint of the tokenizer; ``table_min``: ``IndexParams.table_min_total``."""
    shard_tokens = math.ceil(size * 1.03 / shards)  # shards close at document ends, a little short of this
    child = subprocess.run([sys.executable, "-c", BUILD_CHILD, str(stream), str(size), str(shard_tokens), str(out),
                            header["fingerprint"], str(header["vocab_size"]), str(table_min)], capture_output=True,
                           text=True,
                           cwd=REPO, check=False)
    if child.returncode != 0:
        raise SystemExit(f"build failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def time_drafting(paths: list[Path], contexts: list[np.ndarray]) -> list[tuple[dict, list]]:
    """Per store of ``paths`` (one corpus): per-step drafting times (ms: p50, p99, p99 of each step's
    fastest of REPEATS) of its n-gram and suffix drafters together, its verified open time, and
    every step's drafts. The stores take turns on each context, so load from other jobs on the
    machine falls on all of them alike."""
    from retrieval_draft.drafters.ngram import NgramDrafter
    from retrieval_draft.drafters.suffix import SuffixDrafter
    from retrieval_draft.store.opening import open_datastore

    opened, open_s = [], []
    for path in paths:
        start = time.perf_counter()
        opened.append(open_datastore(path))
        open_s.append(time.perf_counter() - start)
    drafters = [(NgramDrafter(store), SuffixDrafter(store)) for store in opened]
    for context in contexts[:50]:
        for pair in drafters:
            for drafter in pair:
                drafter.propose(context, 8)
    first, best, drafts = ([[] for _ in paths] for _ in range(3))
    for context in contexts:
        for s, pair in enumerate(drafters):
            runs = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                step = [drafter.propose(context, 8) for drafter in pair]
                runs.append(time.perf_counter() - start)
            first[s].append(runs[0] * 1e3)
            best[s].append(min(runs) * 1e3)
            drafts[s].append([[(d.tokens.tolist(), d.probs.tolist()) for d in part] for part in step])
    return [({"p50_ms": round(float(np.percentile(first[s], 50)), 4),
              "p99_ms": round(float(np.percentile(first[s], 99)), 4),
              "p99_min3_ms": round(float(np.percentile(best[s], 99)), 4), "open_verified_s": round(open_s[s], 3)},
             drafts[s]) for s in range(len(paths))]


def store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(stream: Path, sizes: list[int], shard_counts: list[int], contexts: int, keep: bool,
            table_min: int) -> list[dict]:
    """One row per (size, shard count): build numbers, drafting numbers, drafts identical to 1 shard."""
    from retrieval_draft.store.tokenizer import tokenizer_fingerprint, tokenizer_vocab_size
    from retrieval_draft.model.models import load_tokenizer

    tokenizer = load_tokenizer()
    header = {"fingerprint": tokenizer_fingerprint(tokenizer), "vocab_size": tokenizer_vocab_size(tokenizer)}
    rows = []
    for size in sizes:
        ctx = sample_contexts(stream, size, contexts)
        outs = [CACHE / f"store-{size}-{shards}" for shards in shard_counts]
        builds = [build_store(stream, size, shards, out, header, table_min) for shards, out in zip(shard_counts, outs)]
        timed = time_drafting(outs, ctx)
        reference = timed[0][1]
        for shards, out, built, (drafting, drafts) in zip(shard_counts, outs, builds, timed):
            stats = built["stats"]
            row = {"tokens": stats["tokens"], "shards_asked": shards, "shards": stats["shards"],
                   "max_shard_tokens": built["max_shard_tokens"], "table_min_total": table_min,
                   "build_wall_s": round(built["wall_s"], 2), "shards_s": stats["shards_seconds"],
                   "table_s": stats["table_seconds"], "build_tok_per_s": round(stats["tokens"] / built["wall_s"]),
                   "peak_rss_mb": round(built["peak_rss_mb"]), "bytes_per_token": round(store_bytes(out) / stats["tokens"], 3),
                   **drafting, "identical_steps": f"{sum(a == b for a, b in zip(drafts, reference))}/{len(drafts)}",
                   "identical_ngram": sum(a[0] == b[0] for a, b in zip(drafts, reference)),
                   "identical_suffix": sum(a[1] == b[1] for a, b in zip(drafts, reference))}
            if shards == shard_counts[0] and size == sizes[-1]:
                row.update(store_shape(out))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        del timed
        if not keep:
            for out in outs:
                shutil.rmtree(out, ignore_errors=True)
    return rows


def store_shape(path: Path) -> dict:
    """What the projection needs from the largest one-shard store: the biggest first-token bucket's
    share of the rows (the table pass never splits a bucket) and the table's bytes per token."""
    from retrieval_draft.store.opening import open_datastore

    store = open_datastore(path, verify=False)
    shard = store.shards[0]
    vocab = store.vocab_size
    rows = shard.range_hi[:vocab].astype(np.int64) - shard.range_lo[:vocab]
    tokens = int(store.manifest["stats"]["tokens"])
    return {"largest_bucket_share": round(float(rows.max()) / tokens, 4),
            "table_bytes_per_token": round((path / "ngram.arrow").stat().st_size / tokens, 3)}


def project(rows: list[dict], ram_gb: float = 24.0, targets=(10**9, 10**10)) -> list[dict]:
    """Paper projection from measured per-shard costs (module docstring of the docs page says how).

    Drafting: at the largest measured size L, p99 (fastest of 3) = a + b * shards (least squares over
    the shard counts); growth with size at one shard = c * log2(size) (fit over sizes). Build: the
    rates of the shard pass and of the table pass at L (tokens/s, this machine's 2 cores), divided
    by workers on a cluster. Memory: peak RSS = m0 + k * shard tokens (fit over every row); a shard
    may use 80% of ``ram_gb``. Limits reported: 2**31 tokens per shard, the store's bytes against
    RAM (beyond it drafting reads disk), the largest first-token bucket in one table task, the
    whole table written by one process.
    """
    largest = max(r["tokens"] for r in rows)
    at_l = sorted((r for r in rows if r["tokens"] == largest), key=lambda r: r["shards"])
    b, a = np.polyfit([r["shards"] for r in at_l], [r["p99_min3_ms"] for r in at_l], 1)
    one = sorted((r for r in rows if r["shards"] == at_l[0]["shards"]), key=lambda r: r["tokens"])
    c = np.polyfit(np.log2([r["tokens"] for r in one]), [r["p99_min3_ms"] for r in one], 1)[0] if len(one) > 1 else 0.0
    c = max(0.0, c)  # a binary search never gets cheaper as the store grows: a negative fit is noise
    k, m0 = np.polyfit([r["max_shard_tokens"] for r in rows], [r["peak_rss_mb"] for r in rows], 1)
    shard_cap = min(2**31 - 2, int((0.8 * ram_gb * 1024 - m0) / max(k, 1e-9)))
    ref = at_l[-1]
    shard_rate, table_rate = ref["tokens"] / ref["shards_s"], ref["tokens"] / ref["table_s"]
    out = []
    for size in targets:
        shards = max(16, math.ceil(size / shard_cap))
        store_gb = at_l[0]["bytes_per_token"] * size / 2**30
        out.append({
            "tokens": size, "shards": shards, "shard_tokens": math.ceil(size / shards),
            "p99_ms_per_step": round(a + b * shards + c * math.log2(size / largest), 3),
            "build_hours_here": round((size / shard_rate + size / table_rate) / 3600, 2),
            "build_hours_32_such_machines": round((size / shard_rate + size / table_rate) / 3600 / 32, 2),
            "store_gb": round(store_gb, 1), "fits_page_cache_here": store_gb < ram_gb,
            "largest_table_task_gb": round(at_l[0]["largest_bucket_share"] * size * 30 / 2**30, 1),
            "table_gb_one_writer": round(at_l[0]["table_bytes_per_token"] * size / 2**30, 2),
        })
    fit = {"p99_ms_per_shard": round(b, 4), "p99_ms_base": round(a, 4), "p99_ms_per_doubling": round(c, 4),
           "rss_mb_per_shard_mtoken": round(k * 1e6, 1), "rss_mb_base": round(m0), "shard_cap_tokens": shard_cap,
           "shard_pass_tok_per_s": round(shard_rate), "table_pass_tok_per_s": round(table_rate)}
    return [fit, *out]


COLUMNS = ("tokens", "shards", "p50_ms", "p99_ms", "p99_min3_ms", "identical_steps", "build_wall_s", "build_tok_per_s",
           "peak_rss_mb", "bytes_per_token")


def markdown(rows: list[dict], projection: list[dict]) -> str:
    """The measured table and the projection table as markdown."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(f"{r[c]:,}" if isinstance(r[c], int) else str(r[c]) for c in COLUMNS) + " |"
              for r in rows]
    fit, *targets = projection
    keys = list(targets[0])
    lines += ["", "fit: " + ", ".join(f"{k}={v}" for k, v in fit.items()), "",
              "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"{t[k]:,}" if isinstance(t[k], int) and not isinstance(t[k], bool) else str(t[k])
                                for k in keys) + " |" for t in targets]
    return "\n".join(lines)


def chart(rows: list[dict], path: Path) -> None:
    """Three panels against store size, one line per shard count: p99 and p50 drafting ms per step,
    build throughput, peak RSS. Written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for shards in sorted({r["shards_asked"] for r in rows}):
        part = sorted((r for r in rows if r["shards_asked"] == shards), key=lambda r: r["tokens"])
        x = [r["tokens"] / 1e6 for r in part]
        line = axes[0].plot(x, [r["p99_min3_ms"] for r in part], marker="o", label=f"{shards} shard(s) p99")[0]
        axes[0].plot(x, [r["p50_ms"] for r in part], marker=".", linestyle="--", color=line.get_color(),
                     label=f"{shards} shard(s) p50")
        axes[1].plot(x, [r["build_tok_per_s"] / 1e6 for r in part], marker="o", label=f"{shards} shard(s)")
        axes[2].plot(x, [r["peak_rss_mb"] / 1024 for r in part], marker="o", label=f"{shards} shard(s)")
    titles = ("drafting per step (n-gram + suffix), ms", "build throughput (indexing), M tokens/s",
              "build peak RSS, GB")
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("store size, M tokens")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_write_bytes(path, buffer.getvalue())


def parse_size(text: str, full: int) -> int:
    """'10M' -> 10,000,000; 'full' -> the whole stream."""
    text = text.strip().lower()
    if text == "full":
        return full
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1], 1)
    return min(full, int(float(text.rstrip("kmg")) * scale))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10M,20M,40M,full", help="store sizes (tokens, 'full' = whole corpus)")
    parser.add_argument("--shards", default="1,4,16", help="shard counts (first one is the reference)")
    parser.add_argument("--contexts", type=int, default=1000, help="drafting steps timed per store")
    parser.add_argument("--table-min-total", type=int, default=64,
                        help="the stores' n-gram table threshold (2 = every context that drafts is in the table)")
    parser.add_argument("--keep", action="store_true", help="keep the stores under .cache/store_scale")
    stem = RESULTS / f"{time.strftime('%Y-%m-%d')}-cpu2-store-scale"
    parser.add_argument("--json", type=Path, default=stem.with_suffix(".json"))
    parser.add_argument("--png", type=Path, default=stem.with_suffix(".png"))
    args = parser.parse_args()
    stream = corpus_stream()
    full = stream.stat().st_size // 2
    sizes = sorted({parse_size(s, full) for s in args.sizes.split(",")})
    shard_counts = [int(s) for s in args.shards.split(",")]
    rows = measure(stream, sizes, shard_counts, args.contexts, args.keep, args.table_min_total)
    projection = project(rows)
    print(markdown(rows, projection))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    body = {"corpus_tokens": full, "rows": rows, "projection": projection, "date": time.strftime("%Y-%m-%d %H:%M")}
    atomic_write_bytes(args.json, (json.dumps(body, indent=2) + "\n").encode())
    chart(rows, args.png)
    print(f"wrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
