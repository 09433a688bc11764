"""``retrieval-draft build`` as a user types it, through the program's own entry point: the sharded
and flat builds with their progress output on, every accepted sort and trie depth giving a store
that drafts, numbers out of range refused with their range before the tokenizer loads, and the
source options (``--exclude``, ``--field``, ``--column``) and ``--min-count`` doing what they say."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retrieval_draft.drafters.ngram import NgramDrafter
from retrieval_draft.drafters.suffix import MAX_MATCH, SuffixDrafter
from retrieval_draft.store.opening import open_datastore
from retrieval_draft.store.sharded import ShardedDatastore
from tests.datastore_fixtures import bpe_tokenizer, stdlib_corpus, word_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """(a folder of two stdlib modules, the folder of a BPE tokenizer trained on them)."""
    root = tmp_path_factory.mktemp("options")
    modules = stdlib_corpus(root / "all")
    src = root / "py"
    src.mkdir()
    for name in ("bisect.py", "heapq.py"):
        (src / name).write_text((modules / name).read_text())
    bpe_tokenizer([p.read_text() for p in sorted(src.glob("*.py"))]).save_pretrained(root / "tok")
    return src, root / "tok"


def main(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the ``retrieval-draft`` program's own entry point."""
    from retrieval_draft_datastore.cli import main as program

    capsys.readouterr()
    code = program(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_sharded_build_with_its_progress_output_gives_a_store_that_opens(corpus, tmp_path, capsys):
    """The README's sharded build without --quiet (it crashed with NameError after the first shard)."""
    src, tok = corpus
    code, out, err = main(["build", str(src), "--out", str(tmp_path / "s"), "--tokenizer", str(tok),
                           "--shard-tokens", "2000"], capsys)
    assert code == 0, err
    store = open_datastore(tmp_path / "s")
    assert isinstance(store, ShardedDatastore) and len(store.shards) >= 2
    printed = re.findall(r"^shard (\d+): (\d+) tokens$", err, re.M)
    assert [(int(i), int(n)) for i, n in printed] == [(i, int(s.tokens.size)) for i, s in enumerate(store.shards)]
    assert out.startswith(f"built {tmp_path / 's'}: 2 documents")


def test_a_flat_build_with_its_progress_output_gives_a_store_that_opens(corpus, tmp_path, capsys):
    src, tok = corpus
    code, out, err = main(["build", str(src), "--out", str(tmp_path / "s"), "--tokenizer", str(tok)], capsys)
    assert code == 0, err
    tokens = open_datastore(tmp_path / "s").tokens.size
    assert f"indexing {tokens} tokens" in err and out.startswith(f"built {tmp_path / 's'}: 2 documents, {tokens}")


def _followers(tokens: np.ndarray, key: np.ndarray) -> set[int]:
    """Every token that follows an occurrence of ``key`` in ``tokens`` (brute force)."""
    n = key.size
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
    hits = np.flatnonzero((windows == key).all(axis=1))
    return {int(tokens[i + n]) for i in hits}


# (max_order, sort_depth, trie_depth, sharded): the smallest and largest depths the builder takes
DEPTHS = [(1, 2, 1, False), (1, 2, 2, True), (4, 8, 8, False), (4, 12, 2, True), (15, 255, 255, False),
          (15, 255, 255, True)]


@pytest.mark.parametrize("max_order, sort_depth, trie_depth, sharded", DEPTHS,
                         ids=[f"order{o}-sort{s}-trie{t}{'-sharded' if h else ''}" for o, s, t, h in DEPTHS])
def test_every_accepted_sort_and_trie_depth_gives_a_store_that_drafts(corpus, tmp_path, capsys, max_order,
                                                                      sort_depth, trie_depth, sharded):
    src, tok = corpus
    out = tmp_path / "s"
    argv = ["build", str(src), "--out", str(out), "--tokenizer", str(tok), "--quiet", "--max-order", str(max_order),
            "--sort-depth", str(sort_depth), "--trie-depth", str(trie_depth), "--table-min-total", "4"]
    code, _, err = main(argv + (["--shard-tokens", "2000"] if sharded else []), capsys)
    assert code == 0, err
    code, printed, err = main(["inspect", str(out), "--tokenizer", str(tok), "--query", "def insort_left(a, x"],
                              capsys)
    assert code == 0 and "suffix continuations" in printed, err
    store = open_datastore(out)
    stream = np.concatenate([np.asarray(s.tokens) for s in store.shards]).astype(np.int64)
    context = stream[200:240]  # a window of the first module: no separator in it
    suffix = SuffixDrafter(store)
    m, _ = suffix.longest_match(context)
    assert m == min(MAX_MATCH, sort_depth)  # the default match length fits the store's sort depth
    drafts = suffix.propose(context, 6)
    assert drafts and {int(d.tokens[0]) for d in drafts} <= _followers(stream, context[-m:])
    ngram = NgramDrafter(store).propose(context, 6)
    assert ngram and {int(d.tokens[0]) for d in ngram} <= _followers(stream, context[-1:])


REFUSED = [
    (["--max-order", "0"], "--max-order must be an integer in 1..15, got 0"),
    (["--max-order", "16"], "--max-order must be an integer in 1..15, got 16"),
    (["--sort-depth", "256"], "--sort-depth must be an integer in 5..255 (above --max-order), got 256"),
    (["--max-order", "4", "--sort-depth", "4"], "--sort-depth must be an integer in 5..255"),
    (["--trie-depth", "0"], "--trie-depth must be an integer in 1..16 (at most --sort-depth), got 0"),
    (["--sort-depth", "8", "--trie-depth", "9"], "--trie-depth must be an integer in 1..8"),
    (["--top-k", "0"], "--top-k must be an integer in 1..64, got 0"),
    (["--top-k", "65"], "--top-k must be an integer in 1..64, got 65"),
    (["--min-count", "0"], "--min-count must be an integer in 1..4294967295, got 0"),
    (["--min-count", str(2**32)], "--min-count must be an integer in 1..4294967295"),
    (["--table-min-total", "0"], "--table-min-total must be an integer in 1..4294967295, got 0"),
    (["--engine", "ray", "--address", "nope"], "--address 'nope' is not a Ray address"),
    (["--engine", "ray", "--address", "head:port"], "--address 'head:port' is not a Ray address"),
    (["--address", "head:6379"], "--address and --workers need --engine ray"),
]


@pytest.mark.parametrize("extra, said", REFUSED, ids=[" ".join(e) for e, _ in REFUSED])
def test_a_build_option_out_of_range_is_one_line_with_its_range_before_the_tokenizer_loads(
        corpus, tmp_path, capsys, monkeypatch, extra, said):
    import retrieval_draft_datastore.commands as commands

    monkeypatch.setattr(commands, "_tokenizer", lambda args: pytest.fail("the tokenizer was loaded"))
    src, _ = corpus
    code, _, err = main(["build", str(src), "--out", str(tmp_path / "s"), *extra], capsys)
    assert code == 2 and err.startswith(f"error: {said}") and err.count("\n") == 1, err
    assert not (tmp_path / "s").exists()


def test_exclude_field_and_column_choose_what_is_read(tmp_path, capsys):
    """A folder of a text file, a JSONL file, a Parquet file and an excluded subfolder: only the
    named field and column and the files not excluded reach the store."""
    tokenizer = word_tokenizer("alpha bravo charlie delta echo foxtrot golf".split())
    tokenizer.save_pretrained(tmp_path / "tok")
    src = tmp_path / "src"
    (src / "drafts").mkdir(parents=True)
    (src / "a.txt").write_text("alpha alpha\n")
    (src / "b.jsonl").write_text(json.dumps({"body": "bravo bravo", "title": "charlie"}) + "\n")
    pq.write_table(pa.table({"content": ["delta delta"], "note": ["echo"]}), src / "c.parquet")
    (src / "drafts" / "d.txt").write_text("foxtrot\n")
    code, _, err = main(["build", str(src), "--out", str(tmp_path / "s"), "--tokenizer", str(tmp_path / "tok"),
                         "--quiet", "--exclude", "drafts", "--field", "body", "--column", "content"], capsys)
    assert code == 0, err
    store = open_datastore(tmp_path / "s")
    ids = [int(t) for t in store.tokens if t != store.separator]
    assert tokenizer.decode(ids).split() == ["alpha", "alpha", "bravo", "bravo", "delta", "delta"]


def test_min_count_drops_contexts_seen_fewer_times(tmp_path, capsys):
    """'alpha' is followed by 'bravo' twice: it drafts with --min-count 2, not with --min-count 3."""
    tokenizer = word_tokenizer("alpha bravo charlie delta".split())
    tokenizer.save_pretrained(tmp_path / "tok")
    (tmp_path / "a.txt").write_text("alpha bravo charlie alpha bravo delta\n")
    drafted = {}
    for min_count in (2, 3):
        out = tmp_path / f"s{min_count}"
        code, _, err = main(["build", str(tmp_path / "a.txt"), "--out", str(out), "--tokenizer",
                             str(tmp_path / "tok"), "--quiet", "--min-count", str(min_count),
                             "--table-min-total", "1"], capsys)
        assert code == 0, err
        store = open_datastore(out)
        assert store.params["min_count"] == min_count
        context = np.array(tokenizer("charlie alpha")["input_ids"], np.int64)
        drafted[min_count] = [tokenizer.decode(d.tokens.tolist()) for d in NgramDrafter(store).propose(context, 1)]
    assert drafted == {2: ["bravo"], 3: []}
