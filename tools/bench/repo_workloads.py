"""Repository-completion workloads: complete a held-out file's functions with the rest of its package as a store.

- ``repo_raw``: the held-out file's text up to and including a function's docstring, as a raw
  completion (the model writes the body).
- ``repo_chat``: the function's signature and docstring in a "complete this function" chat request.

For each installed pure-Python package of ``REPO_SOURCES`` (site-packages, never the standard
library) one file is held out; the rest of the package becomes a repo store
(``retrieval_draft_datastore.repo_store``, the ``retrieval-draft repo`` builder), built once and
cached under ``.cache/bench-repo-stores/`` keyed by package, version, held-out file and tokenizer
fingerprint, so reruns reuse it. The datastore systems then draft from ``[repo store, general
store]``. Prompts come in a fixed order: each package's documented functions (with a body of
``MIN_BODY_LINES`` lines or more after the docstring) shuffled by a seeded generator, then taken
round-robin over the packages, so ``n`` prompts are always the first ``n`` of the same list.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import random
import shutil
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO_WORKLOADS = ("repo_raw", "repo_chat")
CACHE_ROOT = Path(__file__).resolve().parents[2] / ".cache" / "bench-repo-stores"
MAX_PREFIX_CHARS = 6000  # a raw prompt keeps the end of the file's prefix (whole lines): ~1.5-2k tokens
MIN_BODY_LINES = 3  # lines after the docstring, so there is a body to complete


@dataclass(frozen=True)
class RepoSource:
    """An installed package and the file held out of its store (``held_out``: '/'-separated, inside the package)."""

    package: str
    held_out: str


REPO_SOURCES = (
    RepoSource("click", "termui.py"),
    RepoSource("jinja2", "filters.py"),
    RepoSource("packaging", "specifiers.py"),
    RepoSource("requests", "utils.py"),
)


@dataclass(frozen=True)
class HeldOutFunction:
    """One documented function of a held-out file.

    Attributes:
        qualname: ``Class.method`` or ``function``.
        prefix: the file's text through the docstring's last line (newline included), at most
            ``MAX_PREFIX_CHARS`` characters, cut at a line start.
        stub: decorators, signature and docstring, dedented.
    """

    qualname: str
    prefix: str
    stub: str


@dataclass(frozen=True)
class RepoPrompt:
    """One prompt of a repo workload: id, text, chat or raw, and the repo store it drafts from."""

    prompt_id: str
    text: str
    chat: bool
    store: str


def package_dir(package: str) -> Path:
    """The folder of an installed top-level package; ValueError for a missing or standard-library one."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package} is not an installed package")
    folder = Path(list(spec.submodule_search_locations)[0]).resolve()
    if not {"site-packages", "dist-packages"} & set(folder.parts):
        raise ValueError(f"{package} is not in site-packages (the standard library?); choose an installed package")
    return folder


def package_version(package: str) -> str:
    """The installed version of the distribution providing ``package``."""
    distributions = importlib.metadata.packages_distributions().get(package, [package])
    return importlib.metadata.version(distributions[0])


def _documented(body: list, outer: str = "") -> list[tuple[str, ast.AST]]:
    """(qualname, node) of the functions and methods in ``body`` with a docstring (not nested in functions)."""
    found = []
    for node in body:
        if isinstance(node, ast.ClassDef):
            found += _documented(node.body, f"{outer}{node.name}.")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) is not None:
            found.append((f"{outer}{node.name}", node))
    return found


def held_out_functions(text: str) -> list[HeldOutFunction]:
    """Every documented function of the source ``text`` with a body of ``MIN_BODY_LINES`` or more
    lines after its docstring, in source order."""
    lines = text.splitlines(keepends=True)
    functions = []
    for qualname, node in _documented(ast.parse(text).body):
        doc_end = node.body[0].end_lineno
        if node.end_lineno - doc_end < MIN_BODY_LINES:
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        prefix = "".join(lines[:doc_end])
        if len(prefix) > MAX_PREFIX_CHARS:
            tail = prefix[-MAX_PREFIX_CHARS:]
            prefix = tail[tail.find("\n") + 1 :]
        stub = textwrap.dedent("".join(lines[start - 1 : doc_end]))
        functions.append(HeldOutFunction(qualname, prefix, stub))
    return functions


def store_key(source: RepoSource, version: str, fingerprint: str) -> str:
    """The cache folder name of one repo store: package, version, held-out file, tokenizer fingerprint."""
    held = source.held_out.replace("/", "_").replace(".", "_")
    return f"{source.package}-{version}-without-{held}-{fingerprint[:16]}"


def repo_store(source: RepoSource, tokenizer, cache_root: Path = CACHE_ROOT) -> Path:
    """The repo store of ``source``'s package without its held-out file, built on first use.

    The package is copied (less the held-out file and ``__pycache__``) into a temp folder
    outside any git work tree, then built with ``update_repo_store`` into the cache, which
    swaps the finished store into place; a later call finds it and builds nothing.
    """
    from retrieval_draft.store.layout import MANIFEST
    from retrieval_draft.store.tokenizer import tokenizer_fingerprint
    from retrieval_draft_datastore.repo_store import update_repo_store

    folder = package_dir(source.package)
    out = cache_root / store_key(source, package_version(source.package), tokenizer_fingerprint(tokenizer))
    if (out / MANIFEST).is_file():
        return out
    if not (folder / source.held_out).is_file():
        raise ValueError(f"{source.package} has no file {source.held_out}")
    held = folder / source.held_out

    def skipped(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or Path(directory, n) == held]

    print(f"[bench] building the repo store of {source.package} without {source.held_out} ...", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-repo-") as tmp:
        staged = Path(tmp) / source.package
        shutil.copytree(folder, staged, ignore=skipped)
        update_repo_store(staged, out, tokenizer)
    return out


def repo_prompts(n: int, seed: int, chat: bool, tokenizer, sources: tuple[RepoSource, ...] = REPO_SOURCES,
                 cache_root: Path = CACHE_ROOT) -> list[RepoPrompt]:
    """The first ``n`` prompts of ``repo_chat`` (``chat``) or ``repo_raw``; see the module docstring."""
    per_source = []
    for source in sources:
        text = (package_dir(source.package) / source.held_out).read_text(encoding="utf-8")
        functions = held_out_functions(text)
        random.Random(f"{seed}:{source.package}:{source.held_out}").shuffle(functions)
        per_source.append((source, functions))
    picked = []
    for rank in range(max((len(f) for _, f in per_source), default=0)):
        picked += [(source, functions[rank]) for source, functions in per_source if rank < len(functions)]
    prompts = []
    for source, function in picked[:n]:
        store = str(repo_store(source, tokenizer, cache_root))
        where = f"{source.package}/{source.held_out}"
        if chat:
            text = f"Complete this function from `{where}`:\n```python\n{function.stub}```"
        else:
            text = function.prefix
        prompts.append(RepoPrompt(f"{where}:{function.qualname}", text, chat, store))
    return prompts
