"""The package's layers, checked on the source with ``ast`` (nothing is imported).

``core`` is pure logic: no broker client, no settings loading, nothing above it.
``amqp`` talks to the broker and knows nothing of the worker or the CLI; the worker
knows nothing of the CLI.  And no two modules import each other at import time.

Layer rules count every import, even inside functions or under ``TYPE_CHECKING``:
those still tie the layers together.  The cycle check counts only the imports that
run when a module is imported (module level, not under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "rmqdelay"
ROOT = Path(__file__).resolve().parents[2]

# layer -> what it must not import (a module and everything below it)
# the dashboard and the CLI are the top layer, side by side: the wording both print is
# the results' own (describe()), so the dashboard imports nothing of the CLI; the CLI
# starts the dashboard only inside its command (rmqdelay/cli/dashboard.py).
# The bridge is an application above the worker (it may use core, settings, amqp and
# the worker); only the CLI imports it
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "rmqdelay.core": (
        "rmqdelay.amqp",
        "rmqdelay.worker",
        "rmqdelay.cli",
        "rmqdelay.dashboard",
        "rmqdelay.bridge",
        "rmqdelay.settings",
        "pika",
        "aio_pika",
        "aiormq",
        "pamqp",
        "pydantic_settings",
    ),
    # the journal sits between a message (publishing.outgoing) and the publisher's flows
    "rmqdelay.core.journal": tuple(
        f"rmqdelay.core.publishing.{m}"
        for m in ("publisher", "prepare", "sending", "api", "aio_api")
    ),
    "rmqdelay.amqp": ("rmqdelay.worker", "rmqdelay.cli", "rmqdelay.dashboard", "rmqdelay.bridge"),
    "rmqdelay.worker": ("rmqdelay.cli", "rmqdelay.dashboard", "rmqdelay.bridge"),
    "rmqdelay.bridge": ("rmqdelay.cli", "rmqdelay.dashboard"),
    "rmqdelay.settings": ("rmqdelay.dashboard", "rmqdelay.bridge"),
    "rmqdelay.errors": ("rmqdelay.dashboard", "rmqdelay.bridge"),
    "rmqdelay.testing": ("rmqdelay.dashboard", "rmqdelay.bridge"),
    "rmqdelay.dashboard": ("rmqdelay.cli", "rmqdelay.bridge"),
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. rmqdelay.core.plan
    path: Path
    line: int
    target: str  # what it imports, absolute: rmqdelay.errors, pika.exceptions
    at_import_time: bool  # module level and not under TYPE_CHECKING

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.module})"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__.py)."""
    found: dict[str, Path] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _base(module: str, path: Path, level: int) -> str:
    """The package a relative import of *level* dots starts from."""
    parts = module.split(".")
    if path.name != "__init__.py":
        parts.pop()
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts)


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    source = node.module or ""
    if node.level:
        base = _base(module, path, node.level)
        source = f"{base}.{source}" if source else base
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        yield submodule if submodule in MODULES else source  # `from . import errors`


def _imports(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), filename=str(path))

    def walk(node: ast.AST, at_import_time: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, module, path):
                    yield Import(module, path, child.lineno, target, at_import_time)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), False)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), at_import_time)
            else:
                yield from walk(child, at_import_time)

    yield from walk(tree, True)


ALL_IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_package_was_found() -> None:
    assert {"rmqdelay", "rmqdelay.core", "rmqdelay.amqp.publisher"} <= MODULES.keys()
    assert any(imp.target == "rmqdelay.errors" for imp in ALL_IMPORTS)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer: str) -> None:
    broken = [
        f"{imp.where()} imports {imp.target}: {layer} must not import {banned}"
        for imp in ALL_IMPORTS
        if _within(imp.module, layer)
        for banned in FORBIDDEN[layer]
        if _within(imp.target, banned)
    ]
    # the package root re-exports every layer: importing it would hide a breach
    broken += [
        f"{imp.where()} imports {PACKAGE} itself: import the module it needs instead"
        for imp in ALL_IMPORTS
        if _within(imp.module, layer) and imp.target == PACKAGE
    ]
    assert not broken, "\n".join(broken)


def _graph(every: bool = False) -> dict[str, dict[str, Import]]:
    """Module -> the package modules it runs on import (and the import doing it); with
    ``every``, the modules it names in any import (in a function, for types): a package
    named on the way to its module is not counted then, as nothing of it is used."""
    graph: dict[str, dict[str, Import]] = {name: {} for name in MODULES}
    for imp in ALL_IMPORTS:
        if not _within(imp.target, PACKAGE):
            continue
        if every:
            if imp.target in MODULES and imp.target != imp.module:
                graph[imp.module].setdefault(imp.target, imp)
            continue
        if not imp.at_import_time:
            continue
        # importing a.b.c also runs the packages a.b and a, unless already being imported
        parts = imp.target.split(".")
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[:n])
            if name in MODULES and name != imp.module and not _within(imp.module, name):
                graph[imp.module].setdefault(name, imp)
    return graph


def _cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)

    cycles: list[list[str]] = []
    for group in groups:  # walk inside the group from its first member back to it
        start = min(group)
        path, seen = [start], {start}
        while True:
            nxt = next(n for n in sorted(graph[path[-1]]) if n in group)
            if nxt == start or nxt in seen:
                cycles.append([*path[path.index(nxt) :], nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return cycles


def test_only_the_dashboard_command_imports_the_dashboard() -> None:
    """Its libraries are an extra: any other module importing it would need them."""
    found = [
        imp.where()
        for imp in ALL_IMPORTS
        if _within(imp.target, "rmqdelay.dashboard")
        and not _within(imp.module, "rmqdelay.dashboard")
        and (imp.module != "rmqdelay.cli.dashboard" or imp.at_import_time)
    ]
    assert not found, "\n".join(found)


def test_only_the_cli_imports_the_bridge() -> None:
    """An application, as the dashboard: nothing below the CLI may depend on it."""
    found = [
        imp.where()
        for imp in ALL_IMPORTS
        if _within(imp.target, "rmqdelay.bridge")
        and not _within(imp.module, "rmqdelay.bridge")
        and not _within(imp.module, "rmqdelay.cli")
    ]
    assert not found, "\n".join(found)


def test_the_bridge_keeps_its_pure_modules_free_of_io() -> None:
    """Its names and envelope are sans-IO, as core is: what core may not import, they may
    not (nor the rest of the bridge)."""
    pure = ("rmqdelay.bridge.names", "rmqdelay.bridge.envelope")
    banned = (*FORBIDDEN["rmqdelay.core"], "rmqdelay.bridge")
    broken = [
        f"{imp.where()} imports {imp.target}"
        for imp in ALL_IMPORTS
        if imp.module in pure
        and any(_within(imp.target, b) for b in banned)
        and imp.target not in pure
    ]
    assert not broken, "\n".join(broken)
    assert set(pure) <= MODULES.keys()


# what the handling of a delivery stands on in core: the base every concept shares
HANDLING_BASE = ("clock", "durations", "layout", "messages")


def test_handling_stands_on_the_core_base_alone_and_the_core_does_not_lean_on_it() -> None:
    """``core.handling`` is one concept: it uses the core's base, not publishing or the
    journal, and nothing else in core uses it (the worker and the amqp layer do)."""
    handling = "rmqdelay.core.handling"
    allowed = (handling, "rmqdelay.errors", *(f"rmqdelay.core.{m}" for m in HANDLING_BASE))
    broken = [
        f"{imp.where()} imports {imp.target}"
        for imp in ALL_IMPORTS
        if _within(imp.module, handling)
        and _within(imp.target, PACKAGE)
        and not any(_within(imp.target, a) for a in allowed)
    ]
    broken += [
        f"{imp.where()} imports {imp.target}: the rest of core must not use handling"
        for imp in ALL_IMPORTS
        if _within(imp.module, "rmqdelay.core")
        and not _within(imp.module, handling)
        and _within(imp.target, handling)
    ]
    assert not broken, "\n".join(broken)
    assert {f"{handling}.{m}" for m in ("handlers", "retry", "parking", "acks")} <= MODULES.keys()


@pytest.mark.parametrize("every", [False, True], ids=["at-import-time", "any-import"])
def test_no_import_cycle(every: bool) -> None:
    """No cycle at import time; nor through an import in a function or for types, which
    still ties two modules into one concept that should have one home."""
    graph = _graph(every)
    messages = []
    for cycle in _cycles(graph):
        steps = [f"{graph[a][b].where()} imports {b}" for a, b in itertools.pairwise(cycle)]
        messages.append("import cycle:\n  " + "\n  ".join(steps))
    assert not messages, "\n".join(messages)
