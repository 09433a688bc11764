"""Damaged stores, flat and sharded: opening one gives a typed one-line error or a store that drafts
exactly as the undamaged one, never a crash, a hang or a changed file.

Each example copies a store built by the project's builder from five small stdlib modules, damages
the copy (flipped bytes, truncations, deleted files, files swapped, a stray file added) and opens it
as ``datastore=PATH`` does (``StoreCache.open``: identity check, then full verification).
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from retrieval_draft.cache_dir import CACHE_ENV
from retrieval_draft.drafters.registry import STORE_DRAFTERS, DraftSources, make_drafters
from retrieval_draft.errors import RetrievalDraftError
from retrieval_draft.store.opening import open_datastore
from retrieval_draft.store.store_cache import StoreCache
from retrieval_draft_datastore.builder import build
from retrieval_draft_datastore.shard_build import build_sharded
from tests.datastore_fixtures import STDLIB_FILES, bpe_tokenizer, stdlib_corpus
from tests.fuzz.profiles import examples

HANG_SECONDS = 120  # an open and a few drafts of a 20k-token store take well under a second


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """kind ("flat", "sharded") -> (path, fixed contexts from its tokens, its drafts on them undamaged)."""
    root = tmp_path_factory.mktemp("fuzz-stores")
    corpus = stdlib_corpus(root / "corpus")
    sources = [str(corpus / name) for name in STDLIB_FILES]
    tokenizer = bpe_tokenizer([(corpus / name).read_text() for name in STDLIB_FILES])
    build(sources, root / "flat", tokenizer, progress=False)
    build_sharded(sources, root / "sharded", tokenizer, 4000, progress=False)  # about five shards
    found = {}
    for kind in ("flat", "sharded"):
        store = open_datastore(root / kind)
        windows = contexts(store)
        found[kind] = (root / kind, windows, drafts(store, windows))
    return found


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """Verification records go to a cache of this module's own."""
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("fuzz-cache")))
    yield
    patch.undo()


def contexts(store, count: int = 24, length: int = 12) -> list[np.ndarray]:
    """Windows of the store's own tokens (no document separator inside), fixed by a seed."""
    tokens = np.asarray(store.shards[0].tokens)
    rng = np.random.default_rng(3)
    found = []
    while len(found) < count:
        end = int(rng.integers(length, tokens.size))
        window = tokens[end - length : end].astype(np.int64)
        if not np.any(window == store.separator):
            found.append(window)
    return found


def drafts(store, windows) -> list:
    """Every store drafter's proposals (tokens, probabilities) for each window."""
    drafters = make_drafters(STORE_DRAFTERS, DraftSources(store=store))
    return [[(d.tokens.tolist(), np.round(d.probs, 6).tolist()) for d in drafter.propose(w, 8)]
            for drafter in drafters for w in windows]


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@contextmanager
def no_hang(seconds: int):
    def timed_out(signum, frame):
        raise AssertionError(f"opening or drafting took over {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# One damage: (kind, first file index, second file index or offset, amount), indices taken modulo the
# store's file count and sizes, so every draw names a real file.
DAMAGE = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 10**9), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.integers(0, 10**9), st.just(0)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.just(0), st.just(0)),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("stray"), st.integers(0, 10**6), st.just(0), st.integers(0, 255)),
)


def damage(folder: Path, kind: str, first: int, second: int, amount: int) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    if not files:
        return
    target = files[first % len(files)]
    data = target.read_bytes()
    if kind == "flip" and data:
        at = second % len(data)
        target.write_bytes(data[:at] + bytes([data[at] ^ amount]) + data[at + 1 :])
    elif kind == "truncate":
        target.write_bytes(data[: second % max(len(data), 1)])
    elif kind == "delete":
        target.unlink()
    elif kind == "swap":
        other = files[second % len(files)]
        other_data = other.read_bytes()
        other.write_bytes(data)
        target.write_bytes(other_data)
    elif kind == "stray":
        (target.parent / f"stray-{amount}.arrow").write_bytes(bytes([amount]) * 64)


@pytest.mark.parametrize("kind", ["flat", "sharded"])
@settings(max_examples=examples(40))
@given(damages=st.lists(DAMAGE, min_size=1, max_size=3))
def test_a_damaged_store_is_refused_in_one_typed_line_or_drafts_as_before(stores, kind, damages):
    pristine, windows, expected = stores[kind]
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "store"
        shutil.copytree(pristine, copy)
        for one in damages:
            damage(copy, *one)
        before = snapshot(copy)
        with no_hang(HANG_SECONDS):
            try:
                store = StoreCache().open(copy)
            except RetrievalDraftError as error:
                assert "\n" not in str(error) and str(error), repr(error)
                event(f"refused: {type(error).__name__}")
            else:
                assert drafts(store, windows) == expected
                event("opened and drafted as before")
                del store
        assert snapshot(copy) == before  # opening changed, added or removed nothing

