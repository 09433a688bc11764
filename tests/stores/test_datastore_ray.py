"""The Ray builds (``--engine ray``) on one local Ray runtime: same store as the single-process build,
the same after a worker dies, and the old store untouched when it fails; a sharded store built on Ray
(``--shard-tokens N``) has every shard byte-identical to the local build's, each written by its own
task from its own tokens."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from retrieval_draft.errors import InvalidInputError  # noqa: E402
from retrieval_draft.store.layout import DATA_FILES, MANIFEST, NGRAM  # noqa: E402
from retrieval_draft.store.opening import open_datastore  # noqa: E402
from retrieval_draft_datastore.builder import build  # noqa: E402
from retrieval_draft_datastore.index import IndexParams  # noqa: E402
from retrieval_draft_datastore.ray_build import build_ray  # noqa: E402
from retrieval_draft_datastore.ray_shards import build_sharded_ray  # noqa: E402
from retrieval_draft_datastore.ray_tokenise import ShardTokeniser  # noqa: E402
from retrieval_draft_datastore.shard_build import build_sharded  # noqa: E402
from retrieval_draft_datastore.sources import SourceOptions  # noqa: E402
from tests.datastore_fixtures import bpe_tokenizer, stdlib_corpus  # noqa: E402

PY = SourceOptions(globs=("*.py",))
TIMINGS = ("tokenize_seconds", "index_seconds", "engine")
SHARD_PARAMS = IndexParams(table_min_total=8)
SHARD_TOKENS = 3000


def dies_once(marker: Path) -> type:
    """A tokeniser class whose worker kills its own process the first time it sees ``marker``
    (deleting it first, so the retry goes through)."""

    class DiesOnceTokeniser(ShardTokeniser):
        def __call__(self, batch: dict) -> dict:
            try:
                os.unlink(marker)  # the one worker that removes the marker dies; others go on
            except FileNotFoundError:
                pass
            else:
                os._exit(1)
            return super().__call__(batch)

    return DiesOnceTokeniser


@pytest.fixture(scope="module")
def runtime():
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import tests/
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return stdlib_corpus(tmp_path_factory.mktemp("corpus") / "py")


@pytest.fixture(scope="module")
def pieces(tmp_path_factory, corpus) -> Path:
    """The same modules cut into files of 60 lines: many documents, several shards."""
    target = tmp_path_factory.mktemp("pieces") / "py"
    target.mkdir()
    for module in sorted(corpus.glob("*.py")):
        lines = module.read_text().splitlines(keepends=True)
        for i in range(0, len(lines), 60):
            (target / f"{module.stem}_{i // 60:03d}.py").write_text("".join(lines[i : i + 60]))
    return target


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))])


@pytest.fixture(scope="module")
def local_store(tmp_path_factory, corpus, tokenizer) -> dict:
    out = tmp_path_factory.mktemp("local") / "ds"
    return build([str(corpus)], out, tokenizer, options=PY, progress=False)


def _same_store(a: dict, b: dict) -> None:
    assert a["files"] == b["files"]  # sha256 and size of every data file
    strip = lambda stats: {k: v for k, v in stats.items() if k not in TIMINGS}  # noqa: E731
    assert strip(a["stats"]) == strip(b["stats"])
    assert {k: a[k] for k in ("storage", "params", "tokenizer", "format_version")} == \
           {k: b[k] for k in ("storage", "params", "tokenizer", "format_version")}


def test_a_ray_build_with_a_killed_worker_equals_the_single_process_build(runtime, tmp_path, corpus, tokenizer,
                                                                         local_store, capsys):
    """One tokenising worker kills its own process; Ray retries its shard, and the store (sources
    named by file:// URL, read through pyarrow's filesystems) is the single-process build's. The
    progress output is on, as the command line has it without --quiet."""
    marker = tmp_path / "die-once"
    marker.write_text("")
    url = corpus.resolve().as_uri()
    manifest = build_ray([url], tmp_path / "ds", tokenizer, options=PY, workers=2, ranges=3, progress=True,
                         tokeniser=dies_once(marker))
    assert f"indexing {manifest['stats']['tokens']} tokens on ray" in capsys.readouterr().err
    assert not marker.exists()  # a worker did die
    _same_store(manifest, local_store)
    assert manifest["stats"]["engine"] == "ray (2 workers)" and sorted(os.listdir(tmp_path)) == ["ds"]
    assert open_datastore(tmp_path / "ds").tokens.size == manifest["stats"]["tokens"]


def test_a_failed_ray_build_leaves_the_old_store_and_raises_one_line(runtime, tmp_path, corpus, tokenizer):
    build([str(corpus)], tmp_path / "ds", tokenizer, options=PY, progress=False)
    before = (tmp_path / "ds" / MANIFEST).read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(InvalidInputError, match="invalid JSON") as error:
        build_ray([str(corpus), str(bad)], tmp_path / "ds", tokenizer, options=PY, workers=2, progress=False)
    assert "\n" not in str(error.value)
    assert (tmp_path / "ds" / MANIFEST).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl", "ds"]
    assert all((tmp_path / "ds" / name).exists() for name in DATA_FILES)


def test_shards_merge_to_the_single_sort_for_any_cut(runtime):
    from retrieval_draft_datastore.kernels_count import valid_lengths
    from retrieval_draft_datastore.kernels_sort import sort_suffixes
    from retrieval_draft_datastore.ray_index import index_range, range_cuts, sort_shard

    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 6, 4000).astype(np.uint16)
    tokens[rng.random(tokens.size) < 0.03] = 65535
    tokens[[999, 2499, -1]] = 65535  # shard ends
    cuts = range_cuts(tokens, 6, 65535, 4)
    pieces = [sort_shard(tokens, a, b, 16, 65535, cuts) for a, b in ((0, 1000), (1000, 2500), (2500, 4000))]
    vlen = valid_lengths(tokens, 65535, IndexParams().lcp_cap)
    merged = [index_range(tokens, vlen, 16, 65535, IndexParams(), *(p[r] for p in pieces))[0] for r in range(len(cuts))]
    assert np.array_equal(np.concatenate(merged), sort_suffixes(tokens, 16, 65535)[0])


def test_ray_and_local_sharded_builds_are_byte_identical_per_shard(runtime, tmp_path, pieces, tokenizer):
    local = build_sharded([str(pieces)], tmp_path / "local", tokenizer, SHARD_TOKENS, options=PY, params=SHARD_PARAMS,
                          progress=False)
    remote = build_sharded_ray([str(pieces)], tmp_path / "ray", tokenizer, SHARD_TOKENS, options=PY,
                               params=SHARD_PARAMS, workers=2, progress=False)
    assert remote["shards"] == local["shards"] and len(local["shards"]) >= 4
    for record in local["shards"]:
        for name in (MANIFEST, *DATA_FILES):
            a = (tmp_path / "local" / record["dir"] / name).read_bytes()
            assert a == (tmp_path / "ray" / record["dir"] / name).read_bytes(), f"{record['dir']}/{name}"
        assert record["tokens"] <= SHARD_TOKENS  # each task got one shard's tokens
    assert (tmp_path / "local" / NGRAM).read_bytes() == (tmp_path / "ray" / NGRAM).read_bytes()
    assert remote["stats"]["engine"] == "ray (2 workers)" and sorted(os.listdir(tmp_path)) == ["local", "ray"]
    assert len(open_datastore(tmp_path / "ray").shards) == len(local["shards"])


@pytest.mark.parametrize("sharded", [False, True], ids=["flat", "sharded"])
def test_a_ray_build_of_no_files_names_its_sources_and_glob_before_ray_starts(tmp_path, sharded):
    from retrieval_draft.errors import EmptyCorpusError
    from tests.datastore_fixtures import word_tokenizer

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("no python here")
    sources, tokenizer = [str(tmp_path / "docs")], word_tokenizer(["no"])
    with pytest.raises(EmptyCorpusError) as empty:
        if sharded:
            build_sharded_ray(sources, tmp_path / "ds", tokenizer, SHARD_TOKENS, options=PY, progress=False)
        else:
            build_ray(sources, tmp_path / "ds", tokenizer, options=PY, progress=False)
    assert str(empty.value) == f"the corpus produced no tokens: no text in {sources[0]} (glob '*.py')"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"]
