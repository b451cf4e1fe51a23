"""The shape of the code (docs/architecture.md): imports point inward, no cycles, small modules.

The import graph is read with ``ast`` from the application's own modules (``sessions/``
and ``qwenweb/``; migrations aside), imports inside functions included. The line limit also
holds for the browser's modules (``static/qwenweb/*.js``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sessions", "qwenweb")
BROWSER_MODULES = ROOT / "static" / "qwenweb"
MAX_MODULE_LINES = 700

#: The inner layers, and what they may never import (the operator and web sides).
INNER = (
    "sessions.bus",
    "sessions.wire",
    "sessions.backends",
    "sessions.runtime",
    "sessions.transport",
    "sessions.hooks",
    "sessions.process_state",
    "sessions.errors",
)
OUTER = (
    "sessions.ops",
    "sessions.web",
    "sessions.admin",
    "sessions.urls",
    "sessions.serving",
    "sessions.api_client",
    "sessions.scripted_agent",
    "sessions.management",
)


def _module_files() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in _module_files()}


def _resolve(name: str) -> str | None:
    """The project module ``name`` refers to (itself, or the package that holds it)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from package import module`` imports the module; ``from module import
            # name`` the module itself. (Parent packages run first either way, as for
            # every import, so they are not arrows of their own.)
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _within(module: str, layers: tuple[str, ...]) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
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

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_layers():
    # A guard for the tests below: the walk found the modules and their imports.
    assert {"sessions.bus", "sessions.transport.stream", "sessions.ops.records"} <= MODULES.keys()
    assert "sessions.backends.base" in GRAPH["sessions.transport.stream"]


def test_project_imports_form_no_cycle():
    assert _cycles() == []


def test_inner_layers_never_import_the_operator_or_web_side():
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _within(module, INNER)
        for target in targets
        if _within(target, OUTER)
    )
    assert wrong == []


def test_bus_imports_only_itself():  # EB-11: pure asyncio
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _within(module, ("sessions.bus",))
        for target in targets
        if not _within(target, ("sessions.bus",))
    )
    assert wrong == []


def test_wire_format_imports_only_the_bus():
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _within(module, ("sessions.wire",))
        for target in targets
        if not _within(target, ("sessions.wire", "sessions.bus"))
    )
    assert wrong == []


def test_only_the_backends_package_names_a_backend():
    # The backend is chosen in one place (sessions.backends); nobody else imports a
    # concrete backend or branches on the setting.
    concrete = ("sessions.backends.memory", "sessions.backends.redis")
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if not _within(module, ("sessions.backends",))
        for target in targets
        if target in concrete
    )
    branching = sorted(
        module
        for module, path in MODULES.items()
        if not _within(module, ("sessions.backends", "sessions.conf"))
        and ("using_redis" in path.read_text() or '.backend == "' in path.read_text())
    )
    assert (wrong, branching) == ([], [])


def test_no_module_over_700_lines():
    long = {
        module: lines
        for module, path in MODULES.items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_browser_module_over_700_lines():
    scripts = sorted(BROWSER_MODULES.glob("*.js"))
    assert {"sse.js", "session_page.js"} <= {path.name for path in scripts}
    long = {
        path.name: lines
        for path in scripts
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}
