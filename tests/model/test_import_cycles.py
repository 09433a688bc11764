"""No import cycle among the runtime's modules: imports run one way, lazy imports inside functions and
``TYPE_CHECKING`` imports included (a cycle hidden in a function is still two files that need each other)."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "retrieval_draft"


def _module_name(path: Path) -> str:
    parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, modules: set[str], package: str | None = None) -> set[str]:
    """The runtime modules ``path`` imports anywhere in it: ``import a.b``, ``from a import b`` (b a module,
    else a), relative imports resolved against ``package`` (default: the package ``path`` is in)."""
    if package is None:
        package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return found & modules


def _graph() -> dict[str, set[str]]:
    paths = sorted(RUNTIME.rglob("*.py"))
    modules = {_module_name(path) for path in paths}
    return {_module_name(path): _imported(path, modules) - {_module_name(path)} for path in paths}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_runtime_modules_import_each_other_directly_or_round_a_loop():
    assert _cycles(_graph()) == []


def test_the_cycle_check_sees_a_loop_of_three_and_imports_inside_functions(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from retrieval_draft.plugin import hf\n    from . import keywords\n", encoding="utf-8")
    modules = set(_graph())
    assert _imported(source, modules, package="retrieval_draft.plugin") == {"retrieval_draft.plugin.hf",
                                                                            "retrieval_draft.plugin.keywords"}
