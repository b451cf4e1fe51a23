"""The shape of the code (docs/architecture.md): imports point inward, no cycles, small modules.

The import graph is read with ``ast`` from the application's own modules (``sessions/``
and ``qwenweb/``; migrations aside), imports inside functions included. The line limit also
holds for the browser's modules (``static/qwenweb/*.js``) and for the tests
(``tests/**/*.py``, ``tests/js/*.mjs``). No code of the project (tests and bench included)
reaches into asgiref's private attributes: they change without notice between releases.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sessions", "qwenweb")
BROWSER_MODULES = ROOT / "static" / "qwenweb"
TESTS = ROOT / "tests"
PYTHON_TREES = ("sessions", "qwenweb", "tests", "bench")
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


def long_test_files(root: Path = ROOT) -> dict[str, int]:
    """Test files (``tests/**/*.py``, ``tests/js/*.mjs``) over the limit, with their lengths."""
    tests = root / "tests"
    paths = [*tests.rglob("*.py"), *(tests / "js").glob("*.mjs")]
    return {
        str(path.relative_to(root)): lines
        for path in sorted(paths)
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }


def test_no_test_file_over_700_lines():
    assert {"test_architecture.py", "sse_parser.test.mjs"} <= {
        path.name for path in [*TESTS.rglob("*.py"), *(TESTS / "js").glob("*.mjs")]
    }
    assert long_test_files() == {}


def _is_private(attribute: str) -> bool:
    dunder = attribute.startswith("__") and attribute.endswith("__")
    return attribute == "threadlocal" or (attribute.startswith("_") and not dunder)


def asgiref_private_uses(path: Path) -> list[str]:
    """Where ``path`` reads a private attribute of asgiref (``SyncToAsync.threadlocal``,
    ``asgiref.sync._x``, ``from asgiref.x import _y``), as ``file:line name``."""
    text = path.read_text()
    if "asgiref" not in text and "threadlocal" not in text:
        return []
    tree = ast.parse(text, str(path))
    bound: set[str] = set()  # names the module binds to asgiref modules or objects
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "asgiref":
                    bound.add(alias.asname or "asgiref")
                    found += [f"{path.name}:{node.lineno} {alias.name}"] * any(
                        _is_private(part) for part in alias.name.split(".")
                    )
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "asgiref":
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _is_private(alias.name) or any(
                    _is_private(part) for part in (node.module or "").split(".")
                ):
                    found.append(f"{path.name}:{node.lineno} {node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if (isinstance(root, ast.Name) and root.id in bound) or node.attr == "threadlocal":
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_code_reads_asgirefs_private_attributes():
    found = [
        use
        for tree in PYTHON_TREES
        for path in sorted((ROOT / tree).rglob("*.py"))
        for use in asgiref_private_uses(path)
    ]
    assert found == []


def test_the_asgiref_check_sees_private_reads(tmp_path: Path):
    path = tmp_path / "sample.py"
    path.write_text(
        "import asgiref.sync\n"
        "from asgiref.sync import SyncToAsync, _private\n"
        "from asgiref import local as loc\n"
        "SyncToAsync.threadlocal.main_event_loop\n"
        "asgiref.sync._restore_context\n"
        "loc._CVar\n"
        "SyncToAsync.__call__\n"
    )
    assert sorted(use.split(" ")[1] for use in asgiref_private_uses(path)) == [
        "SyncToAsync.threadlocal",
        "asgiref.sync._private",
        "asgiref.sync._restore_context",
        "loc._CVar",
    ]
