"""CLI subcommands ``build``, ``repo``, ``inspect``, ``merge``, ``stats``, ``export`` for ``retrieval-draft``.

``register(subparsers)`` adds them; each sets ``func`` to a function taking
the parsed arguments and returning an exit code. Errors are raised as
``RetrievalDraftError`` subclasses for the caller to print on one line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from retrieval_draft.errors import InvalidInputError
from retrieval_draft.store.opening import open_datastore
from retrieval_draft.store.sharded import ShardedDatastore
from retrieval_draft_datastore.index import IndexParams
from retrieval_draft_datastore.out_path import check_out
from retrieval_draft_datastore.sources import SourceOptions, plan_files


def _add_tokenizer_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--model", help="model directory or .gguf file whose tokenizer to use (default: SmolLM2)")
    group.add_argument("--tokenizer", help="tokenizer directory (or .gguf file)")


def register(subparsers) -> None:
    """Add the datastore subcommands to an argparse ``subparsers`` object."""
    defaults = IndexParams()
    b = subparsers.add_parser("build", help="build a retrieval datastore from text sources")
    b.add_argument("sources", nargs="+", help="directories, text files, .jsonl or .parquet files")
    b.add_argument("--out", required=True, type=Path,
                   help="new or empty folder, or a datastore to replace (anything else is refused)")
    _add_tokenizer_args(b)
    b.add_argument("--glob", action="append", help="file pattern inside directories (repeatable; default '*')")
    b.add_argument(
        "--exclude", action="append", help="skip paths with a component matching this pattern (repeatable)"
    )
    b.add_argument("--field", default="text", help="JSONL field holding the text (default: text)")
    b.add_argument("--column", default="text", help="Parquet column holding the text (default: text)")
    b.add_argument("--max-order", type=int, default=defaults.max_order, help="longest n-gram context")
    b.add_argument("--top-k", type=int, default=defaults.top_k, help="next tokens kept per context")
    b.add_argument("--min-count", type=int, default=defaults.min_count, help="drop rarer contexts")
    b.add_argument("--sort-depth", type=int, default=defaults.sort_depth, help="longest suffix match, tokens")
    b.add_argument("--trie-depth", type=int, default=defaults.trie_depth, help="longest trie key, tokens")
    b.add_argument("--table-min-total", type=int,
                   help="contexts seen at least this often go in the n-gram table; rarer ones are counted "
                        "from the suffix array when drafting (smaller store, same drafts). Default: "
                        f"{defaults.table_min_total}; with --shard-tokens, --min-count (every context that "
                        "drafts is in the table, so no step searches every shard)")
    b.add_argument("--shard-tokens", type=int,
                   help="build a sharded store: shards of whole documents of at most this many tokens, each "
                        "indexed on its own, queried as one store (needed past 2**31 tokens)")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: one process (default); ray: Ray Data, local or a cluster (pip install "
                        "'ray[data]>=2.40')")
    b.add_argument("--address", help="with --engine ray: the Ray cluster to join (default: start a local one)")
    b.add_argument("--workers", type=int, help="with --engine ray: tokenising actors (default: the cluster's CPUs)")
    b.set_defaults(func=cmd_build)
    _register_repo(subparsers)
    i = subparsers.add_parser("inspect", help="describe a datastore and show continuations of a query")
    i.add_argument("path", type=Path, help="datastore folder built by `build`, `repo` or `merge`")
    i.add_argument("--query", help="text whose continuations to show (needs the tokenizer)")
    _add_tokenizer_args(i)
    i.set_defaults(func=cmd_inspect)
    s = subparsers.add_parser("stats", help="datastore numbers as JSON")
    s.add_argument("path", type=Path, help="datastore folder built by `build`, `repo` or `merge`")
    s.set_defaults(func=cmd_stats)
    m = subparsers.add_parser("merge", help="merge two datastores built with the same tokenizer")
    m.add_argument("first", type=Path, help="datastore whose documents come first")
    m.add_argument("second", type=Path, help="datastore whose documents follow (same tokenizer as the first)")
    m.add_argument("--out", required=True, type=Path,
                   help="new or empty folder, or a datastore to replace (anything else is refused)")
    m.set_defaults(func=cmd_merge)
    e = subparsers.add_parser("export", help="write a datastore's counts in another program's format")
    e.add_argument("path", type=Path, help="datastore folder built by `build`, `repo` or `merge`")
    e.add_argument("--llama-cpp", required=True, type=Path, metavar="OUT",
                   help="file to write: llama.cpp's static lookup cache (its 2-token n-gram counts), for "
                        "llama-server --spec-type ngram-cache --lookup-cache-static OUT")
    e.add_argument("--min-total", type=int, default=1,
                   help="leave out contexts seen fewer times than this (default 1: every context)")
    e.set_defaults(func=cmd_export)


def _register_repo(subparsers) -> None:
    """Add ``repo``: build or update a store that follows a source tree."""
    r = subparsers.add_parser("repo", help="build or update a datastore that follows a source tree (git-aware)")
    r.add_argument("src", type=Path, help="source tree; inside a git work tree, the files git lists")
    r.add_argument("--out", required=True, type=Path, help="repo store to build or update")
    _add_tokenizer_args(r)
    r.add_argument("--glob", action="append", help="file name pattern (repeatable; default: common source formats)")
    r.add_argument("--exclude", action="append",
                   help="skip paths with a component matching this pattern (repeatable)")
    r.set_defaults(func=cmd_repo)


def cmd_repo(args) -> int:
    """``repo``: re-tokenise the changed files of ``src`` and re-index ``--out``; prints one line."""
    from retrieval_draft_datastore.repo_files import SOURCE_GLOBS, check_source_root
    from retrieval_draft_datastore.repo_store import check_target, update_repo_store

    check_target(args.out.resolve(), check_source_root(args.src))  # refuse before loading the tokenizer
    options = SourceOptions(globs=tuple(args.glob or SOURCE_GLOBS), excludes=tuple(args.exclude or ()))
    print(update_repo_store(args.src, args.out, _tokenizer(args), options=options).line())
    _compile_query_kernels(args.out)
    return 0


def _compile_query_kernels(path) -> None:
    """Compile the runtime's store queries for the store at ``path`` now (``compile_store_drafters``)."""
    from retrieval_draft.drafters.datastore import compile_store_drafters

    compile_store_drafters(open_datastore(path, verify=False))


def _tokenizer(args):
    """The tokenizer of ``--tokenizer`` or ``--model`` (default: SmolLM2's); errors name the flag's kind."""
    from retrieval_draft.model.models import load_tokenizer

    if args.tokenizer:
        return load_tokenizer(args.tokenizer, kind="tokenizer")
    return load_tokenizer(args.model)


def cmd_build(args) -> int:
    """``build``: tokenise and index the sources into ``--out``."""
    table_min = args.table_min_total
    if table_min is None:
        table_min = args.min_count if args.shard_tokens is not None else IndexParams().table_min_total
    params = IndexParams(max_order=args.max_order, top_k=args.top_k, min_count=args.min_count,
                         sort_depth=args.sort_depth, trie_depth=args.trie_depth, table_min_total=table_min)
    options = SourceOptions(
        globs=tuple(args.glob or ["*"]), excludes=tuple(args.exclude or ()), field=args.field, column=args.column
    )
    if args.engine == "local" and (args.address or args.workers):
        raise InvalidInputError("--address and --workers need --engine ray")
    if args.engine == "ray":
        from retrieval_draft_datastore.ray_run import check_address

        check_address(args.address)
    if args.shard_tokens is not None:
        from retrieval_draft_datastore.shard_build import check_shard_tokens

        check_shard_tokens(args.shard_tokens)
    check_out(args.out)
    plan_files(args.sources, options)  # a missing or binary source: all before loading the tokenizer
    manifest = _run_build(args, params, options)
    stats = manifest["stats"]
    _compile_query_kernels(args.out)
    print(f"built {args.out}: {stats['documents']} documents, {stats['tokens']} tokens")
    return 0


def _run_build(args, params: IndexParams, options: SourceOptions) -> dict:
    """The build ``args`` ask for: local or Ray, flat or sharded (``--shard-tokens``); its manifest."""
    progress = not args.quiet
    if args.engine == "ray":
        ray_args = {"address": args.address, "workers": args.workers, "progress": progress}
        if args.shard_tokens is not None:
            from retrieval_draft_datastore.ray_shards import build_sharded_ray

            return build_sharded_ray(args.sources, args.out, _tokenizer(args), args.shard_tokens, options=options,
                                     params=params, **ray_args)
        from retrieval_draft_datastore.ray_build import build_ray

        return build_ray(args.sources, args.out, _tokenizer(args), options=options, params=params, **ray_args)
    if args.shard_tokens is not None:
        from retrieval_draft_datastore.shard_build import build_sharded

        return build_sharded(args.sources, args.out, _tokenizer(args), args.shard_tokens, options=options,
                             params=params, progress=progress)
    from retrieval_draft_datastore.builder import build

    return build(args.sources, args.out, _tokenizer(args), options=options, params=params, progress=progress)


def cmd_merge(args) -> int:
    """``merge``: recount two stores' streams into ``--out``."""
    from retrieval_draft_datastore.builder import merge

    stats = merge(args.first, args.second, args.out)["stats"]
    print(f"merged into {args.out}: {stats['documents']} documents, {stats['tokens']} tokens")
    return 0


def cmd_export(args) -> int:
    """``export``: the store's 2-token counts as llama.cpp's static lookup cache; prints one line."""
    from retrieval_draft_datastore.llama_export import export_llama_cpp

    print(export_llama_cpp(args.path, args.llama_cpp, min_total=args.min_total).line())
    return 0


def _file_bytes(store) -> dict[str, int]:
    """Bytes per data file name, summed over a sharded store's shards and its own table."""
    total: dict[str, int] = {}
    for part in (store, *store.shards) if isinstance(store, ShardedDatastore) else (store,):
        for name, record in part.manifest["files"].items():
            total[name] = total.get(name, 0) + int(record["bytes"])
    return total


def store_numbers(store) -> dict:
    """Token count, contexts, bytes per token per file, parameters, fingerprint and (sharded) the
    shards of a store (flat or sharded)."""
    stats = store.manifest["stats"]
    tokens = int(stats["tokens"])
    files = _file_bytes(store)
    shards = [{"dir": shard.path.name, "tokens": int(shard.tokens.size),
               "documents": int(shard.manifest["stats"]["documents"]),
               "bytes": sum(int(f["bytes"]) for f in shard.manifest["files"].values())}
              for shard in store.shards] if isinstance(store, ShardedDatastore) else []
    return {
        "path": str(store.path),
        "documents": stats["documents"],
        "tokens": tokens,
        "contexts_per_order": stats["contexts_per_order"],
        "trie_keys": sum(int(shard.manifest["stats"]["trie_keys"]) for shard in store.shards),
        "bytes_per_token": {name: round(size / tokens, 3) for name, size in files.items()},
        "bytes_per_token_total": round(sum(files.values()) / tokens, 3),
        "params": store.params,
        "storage": store.manifest["storage"],
        "tokenizer": store.manifest["tokenizer"],
        "shards": shards,
    }


def cmd_stats(args) -> int:
    """``stats``: the numbers of ``inspect`` as JSON."""
    print(json.dumps(store_numbers(open_datastore(args.path)), indent=2))
    return 0


def cmd_inspect(args) -> int:
    """``inspect``: numbers, then (with --query) the top continuations of the query."""
    from retrieval_draft.drafters.datastore import datastore_drafters

    store = open_datastore(args.path)
    tokenizer = _tokenizer(args) if args.query else None  # a bad tokenizer fails before anything prints
    numbers = store_numbers(store)
    for key in ("documents", "tokens", "contexts_per_order", "trie_keys", "bytes_per_token_total"):
        print(f"{key}: {numbers[key]}")
    print("bytes_per_token: " + ", ".join(f"{k}={v}" for k, v in numbers["bytes_per_token"].items()))
    print("params: " + ", ".join(f"{k}={v}" for k, v in numbers["params"].items()))
    print(f"tokenizer: vocab_size={store.vocab_size} fingerprint={store.fingerprint}")
    if numbers["shards"]:
        print(f"shards: {len(numbers['shards'])} (format {store.manifest['format_version']}, one table, queried as one)")
        for shard in numbers["shards"]:
            print(f"  {shard['dir']}: {shard['tokens']} tokens, {shard['documents']} documents, "
                  f"{shard['bytes'] / 1e6:.1f} MB")
    if args.query:
        ids = np.asarray(tokenizer(args.query, add_special_tokens=False)["input_ids"], dtype=np.int64)
        for drafter in datastore_drafters(store, vocab_size=store.vocab_size, tokenizer=tokenizer):
            print(f"{drafter.name} continuations of {args.query!r}:")
            for draft in drafter.propose(ids, 8):
                probs = " ".join(f"{p:.2f}" for p in draft.probs)
                print(f"  {tokenizer.decode(draft.tokens.tolist())!r}  p=[{probs}]")
    return 0
