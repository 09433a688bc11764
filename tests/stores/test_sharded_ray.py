"""A sharded store built on Ray (``--engine ray --shard-tokens N``) on a local Ray runtime: every
shard byte-identical to the local build's, each written by its own task from its own tokens."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from retrieval_draft.store.layout import DATA_FILES, MANIFEST, NGRAM  # noqa: E402
from retrieval_draft.store.opening import open_datastore  # noqa: E402
from retrieval_draft.store.opening import open_datastore
from retrieval_draft_datastore.index import IndexParams  # noqa: E402
from retrieval_draft_datastore.ray_shards import build_sharded_ray  # noqa: E402
from retrieval_draft_datastore.shard_build import build_sharded  # noqa: E402
from retrieval_draft_datastore.sources import SourceOptions  # noqa: E402
from tests.datastore_fixtures import bpe_tokenizer, stdlib_corpus  # noqa: E402

PY = SourceOptions(globs=("*.py",))
PARAMS = IndexParams(table_min_total=8)
SHARD_TOKENS = 3000


@pytest.fixture(scope="module")
def runtime():
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The stdlib modules cut into files of 60 lines: many documents, several shards."""
    modules = stdlib_corpus(tmp_path_factory.mktemp("modules") / "py")
    target = tmp_path_factory.mktemp("corpus") / "py"
    target.mkdir()
    for module in sorted(modules.glob("*.py")):
        lines = module.read_text().splitlines(keepends=True)
        for i in range(0, len(lines), 60):
            (target / f"{module.stem}_{i // 60:03d}.py").write_text("".join(lines[i : i + 60]))
    return target


def test_ray_and_local_sharded_builds_are_byte_identical_per_shard(runtime, tmp_path, corpus):
    tokenizer = bpe_tokenizer([p.read_text() for p in sorted(corpus.glob("*.py"))])
    local = build_sharded([str(corpus)], tmp_path / "local", tokenizer, SHARD_TOKENS, options=PY, params=PARAMS,
                          progress=False)
    remote = build_sharded_ray([str(corpus)], tmp_path / "ray", tokenizer, SHARD_TOKENS, options=PY, params=PARAMS,
                               workers=2, progress=False)
    assert remote["shards"] == local["shards"] and len(local["shards"]) >= 4
    for record in local["shards"]:
        for name in (MANIFEST, *DATA_FILES):
            a = (tmp_path / "local" / record["dir"] / name).read_bytes()
            assert a == (tmp_path / "ray" / record["dir"] / name).read_bytes(), f"{record['dir']}/{name}"
        assert record["tokens"] <= SHARD_TOKENS  # each task got one shard's tokens
    assert (tmp_path / "local" / NGRAM).read_bytes() == (tmp_path / "ray" / NGRAM).read_bytes()
    assert remote["stats"]["engine"] == "ray (2 workers)" and sorted(os.listdir(tmp_path)) == ["local", "ray"]
    assert len(open_datastore(tmp_path / "ray").shards) == len(local["shards"])
