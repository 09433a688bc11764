"""Nothing under tools/ edits ``sys.path``: tools import the package and each other as installed
(``python -m tools.X`` from the repository root), and a built extension through ``importlib``."""

from __future__ import annotations

import re
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend)\b|\[[^\]]*\]\s*=(?!=)|\+=|=(?!=))")


def test_no_tool_edits_sys_path():
    edits = [f"{path.relative_to(TOOLS.parent)}:{number}: {line.strip()}"
             for path in sorted(TOOLS.rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if EDIT.search(line)]
    assert edits == []
