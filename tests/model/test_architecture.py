"""The house plan holds: imports run one way, and the runtime keeps no hidden module-level state."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "retrieval_draft"
BUILDER = REPO / "datastore"

# The one documented process-wide object and the one drafter menu (read-only mapping).
ALLOWED_STATE = {("sessions/memory.py", "PROCESS_MEMORY"), ("drafters/registry.py", "DRAFTERS")}
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary",
                 "PluginMemory", "StoreCache", "HistoryDrafter", "RecyclingDrafter", "CostCache", "deque"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_runtime_never_imports_the_builder_or_the_tools():
    for path in RUNTIME.rglob("*.py"):
        tops = {_top(name) for name in _imports(path)}
        assert not tops & {"retrieval_draft_datastore", "datastore", "tools"}, path


def test_the_builder_imports_the_runtime_by_its_installed_names_only():
    for path in BUILDER.rglob("*.py"):
        tops = {_top(name) for name in _imports(path)}
        assert "datastore" not in tops and "tools" not in tops, path


# Layer -> the runtime modules it must never import (a name forbids that module and everything under it).
# Layers run bottom to top: the shared value types (draft.py, tree.py), store, model, drafters, planning,
# decode, sessions/memory.py (what calls remember), the plugin (plugin/), sessions/session.py (a loaded
# model generating), the command line (cli/), serving (serving/).
ABOVE_MEMORY = {"plugin", "sessions.session", "cli", "serving"}
FORBIDDEN = {
    "draft.py": {"drafters", "store", "model", "planning", "decode", "sessions"} | ABOVE_MEMORY,
    "tree.py": {"drafters", "store", "model", "planning", "decode", "sessions"} | ABOVE_MEMORY,
    "store": {"drafters", "model", "planning", "decode", "sessions"} | ABOVE_MEMORY,
    "model": {"drafters", "planning", "decode", "sessions"} | ABOVE_MEMORY,
    "drafters": {"planning", "decode"} | ABOVE_MEMORY,  # drafters/datastore.py opens stores through sessions.memory
    "planning": {"decode", "sessions"} | ABOVE_MEMORY,
    "decode": {"sessions"} | ABOVE_MEMORY,
    "sessions/memory.py": ABOVE_MEMORY,
    "plugin": {"sessions.session", "cli", "serving"},
    "sessions/session.py": {"cli", "serving"},
    "cli": {"serving"},
}


def _runtime_imports(path: Path) -> set[str]:
    """The runtime modules ``path`` imports, as dotted names below ``retrieval_draft``, lazy imports included."""
    return {name.split(".", 1)[1] for name in _imports(path) if name.startswith("retrieval_draft.")}


def _forbidden_found(path: Path, forbidden: set[str]) -> set[str]:
    return {name for name in _runtime_imports(path) for bad in forbidden if name == bad or name.startswith(bad + ".")}


def test_imports_run_one_way_down_the_layers():
    for layer, forbidden in FORBIDDEN.items():
        paths = [RUNTIME / layer] if layer.endswith(".py") else sorted((RUNTIME / layer).rglob("*.py"))
        assert paths and all(path.is_file() for path in paths), layer
        for path in paths:
            assert not _forbidden_found(path, forbidden), (path.relative_to(RUNTIME).as_posix(), _forbidden_found(path, forbidden))


def test_the_folders_name_the_architecture():
    for module in ("decode/engine.py", "decode/verify.py", "tree.py", "draft.py", "planning/planner.py",
                   "model/tree_model.py", "store/reader.py", "drafters/registry.py", "config.py", "sessions/memory.py",
                   "plugin/hf.py", "cli/generate.py"):
        assert (RUNTIME / module).is_file(), module


# The files at the top of the runtime: what every room reads (config, errors, atomic, cache_dir; docs/how-it-works.md
# gives each one's reason) and the shared value types (draft, tree).
TOP_FILES = {"__init__.py", "config.py", "errors.py", "atomic.py", "cache_dir.py", "draft.py", "tree.py"}


def test_the_runtime_top_holds_only_the_files_every_room_shares():
    assert {path.name for path in RUNTIME.glob("*.py")} <= TOP_FILES


def _module_level_mutables(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if value is None:
            continue
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp))
        if isinstance(value, ast.Call):
            func = value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            mutable = called in MUTABLE_CALLS
        if mutable:
            names.extend(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_no_module_level_mutable_state_outside_the_documented_objects():
    found = []
    for path in RUNTIME.rglob("*.py"):
        relative = path.relative_to(RUNTIME).as_posix()
        found.extend((relative, name) for name in _module_level_mutables(path) if (relative, name) not in ALLOWED_STATE)
    assert found == []


def test_tools_stand_in_rooms_and_never_import_the_tests():
    flat = sorted(path.name for path in (REPO / "tools").glob("*.py"))
    assert len(flat) <= 8, flat
    for path in (REPO / "tools").rglob("*.py"):
        assert "tests" not in {_top(name) for name in _imports(path)}, path
