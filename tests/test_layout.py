"""The engine's imports run one way: no circle (lazy imports included), the engine never imports pytest or the plugin,
and nothing below the gates imports them, nor anything but the command line its own package."""

import ast
from pathlib import Path

from conftest import ROOT

ENGINE = ROOT / "src" / "h3gate"
ABOVE_THE_GATES = ("h3gate.gates", "h3gate.status", "h3gate.cli")  # what may import h3gate.gates


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ENGINE.rglob("*.py"):
        name = ".".join(path.relative_to(ENGINE.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    return modules


def _imports(path: Path, modules: dict) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function; not what it imports for type checking only."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for branch in ast.walk(tree) if isinstance(branch, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(branch.test) for node in ast.walk(branch)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                      for alias in node.names}
    return found


def test_the_engine_never_imports_pytest_or_the_plugin():
    modules = _modules()
    offenders = {name: sorted(i for i in _imports(path, modules) if i.split(".")[0] in ("pytest", "_pytest", "pytest_h3"))
                 for name, path in modules.items()}
    assert not {name: found for name, found in offenders.items() if found}


def test_only_the_gates_status_and_the_command_line_import_the_gates_and_only_the_command_line_imports_it():
    modules = _modules()
    upward = {}
    for name, path in modules.items():
        found = _imports(path, modules)
        if not name.startswith(ABOVE_THE_GATES):
            upward[name] = sorted(i for i in found if i.startswith("h3gate.gates"))
        if not name.startswith("h3gate.cli"):
            upward.setdefault(name, []).extend(sorted(i for i in found if i.startswith("h3gate.cli")))
    assert not {name: found for name, found in upward.items() if found}


def test_no_module_of_the_engine_imports_itself_back():
    modules = _modules()
    graph = {name: {i for i in _imports(path, modules) if i in modules and i != name} for name, path in modules.items()}
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert circles == []
