"""Issue 22 items 4 and 5: imports flow one way. The UI reaches core only through the
actions (`core.ops`, plus `core.config`, `core.problems` and `core.exits` for types), and
no two modules of core import each other, directly or round a circle. Both read the
source with `ast`, module-level and function-level imports alike (a lazy import inside a
function is still a dependency)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

UI_MAY_IMPORT = ("core.ops", "core.config", "core.problems", "core.exits")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in the file, at any depth; `from a import b`
    names a.b when that is a module of the tree, else a."""
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package, up level - 1
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield node.lineno, child if _is_module(child) else base


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def core_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / "core").rglob("*.py")):
        name = module_name(path)
        graph[name] = {m for _, m in imported(path)
                       if (m == "core" or m.startswith("core.")) and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as the modules round it (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_ui_imports_core_only_through_the_actions() -> None:
    outside = []
    for path in sorted((REPO / "ui").rglob("*.py")):
        for line, name in sorted(set(imported(path))):
            if name.split(".")[0] != "core":
                continue
            if not any(name == ok or name.startswith(ok + ".") for ok in UI_MAY_IMPORT):
                outside.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not outside, "the UI goes through core.ops:\n" + "\n".join(outside)


def test_headless_goes_through_the_actions_as_the_ui_does() -> None:
    """core/headless.py reaches core through core.ops (and the UI's type modules, and
    core.libraries to leave out what its own process will not use)."""
    allowed = (*UI_MAY_IMPORT, "core.libraries")
    outside = [f"core/headless.py:{line} imports {name}"
               for line, name in sorted(set(imported(REPO / "core" / "headless.py")))
               if name.split(".")[0] == "core" and name != "core"
               and not any(name == ok or name.startswith(ok + ".") for ok in allowed)]
    assert not outside, "headless goes through core.ops:\n" + "\n".join(outside)


def test_core_has_no_import_circles() -> None:
    cycle = find_cycle(core_graph())
    assert cycle is None, "import circle in core: " + " -> ".join(cycle or [])


def test_the_checks_see_a_circle_and_a_ui_import() -> None:
    """The helpers find what they look for: a made-up circle and `from core import ops`
    (ops is a module, so it is named as core.ops, not core)."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    names = {name for _, name in imported(REPO / "ui" / "actions.py")}
    assert "core.ops" in names


# core's layers, lowest first: a module imports only from its own layer and those below.
# The config's checks read the data and the models; runs are the folders and processes
# the cache, caption and training jobs are launched into; the check and the memory
# estimate (core.memory) read everything the run will; the actions and the headless CLI
# sit on top. core.memory.advice, which words the settings that need less memory, is
# read by the cache job and the trainer when the GPU runs out, so it sits with the config.
LAYERS = (
    ("core.problems", "core.exits", "core.notices", "core.libraries", "core.fields",
     "core.files"),
    ("core.data", "core.models"),
    ("core.config", "core.memory.advice"),
    ("core.runs",),
    ("core.startup",),
    ("core.cache", "core.caption", "core.merge"),
    ("core.train",),
    ("core.check", "core.memory"),
    ("core.ops", "core.headless", "core"),
)


def layer_of(module: str) -> int:
    for depth in range(module.count(".") + 1, 0, -1):
        prefix = ".".join(module.split(".")[:depth])
        for index, layer in enumerate(LAYERS):
            if prefix in layer:
                return index
    raise AssertionError(f"{module} is in no layer of LAYERS: add it to one")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if layer_of(b) > layer_of(a))


def test_core_imports_only_its_own_layer_and_below() -> None:
    """Issue 22 item 5: no import back up (the data layer once read the config, the
    memory estimate the cache status, the run folder the trainer's checkpoint lookup)."""
    upward = upward_imports(core_graph())
    assert not upward, "imports from a lower layer of core back up: " + ", ".join(upward)


def test_the_layer_check_sees_an_upward_import() -> None:
    assert upward_imports({"core.data.index": {"core.config"}}) == [
        "core.data.index -> core.config"]
    assert upward_imports({"core.config.checks": {"core.data.index"}}) == []


# What of the data layer the memory estimate may read: two pure rules of the config's
# dataset keys (the square bucket of datasets.N.resolution, the control keys in order),
# never an index of the images or the caches' state, which the check passes in
# (estimate_memory's buckets and caches_built).
MEMORY_READS_OF_DATA = ("core.data.buckets", "core.data.controls")


def test_the_memory_estimate_walks_no_dataset_and_no_cache() -> None:
    found = sorted(f"{module} -> {target}" for module, targets in core_graph().items()
                   if module == "core.memory" or module.startswith("core.memory.")
                   for target in targets
                   if target == "core.cache" or target.startswith("core.cache.")
                   or (target.startswith("core.data") and target not in MEMORY_READS_OF_DATA))
    assert not found, "the memory estimate is told, it does not look: " + ", ".join(found)
