"""The package's imports go one way: no module imports another that (through any chain) imports
it back, and no layer imports one above it. Read from the source with ast (every import,
those inside functions and under TYPE_CHECKING too), so a loop hidden in a function counts.

The layers, from the ground up (the path says which process a module runs in,
docs/explanation/architecture.md): core/ and datasets/ (anywhere), rank/ (inside a rank),
kernel/ and views/ (the kernel), forkserver/ (the kernel and the forkserver), raynode/ (the Ray
driver and actors of --launcher ray), sources/ (the kernel), then export.py, api.py, magic.py and
__init__.py (the extension)."""
from __future__ import annotations

import ast
import pathlib

import nbddp

ROOT = pathlib.Path(nbddp.__file__).parent

# What each layer may import besides itself.
MAY_IMPORT = {
    "core": set(),
    "datasets": set(),
    "rank": {"core"},
    "kernel": {"core", "rank"},
    "views": {"core", "kernel"},
    "forkserver": {"core", "rank", "kernel"},
    "raynode": {"core"},
    "sources": {"core", "rank", "kernel", "views", "forkserver", "raynode"},
}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The nbddp modules ``name`` imports, anywhere in its file."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in MODULES and t != name}
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT) else "top"


def test_no_module_imports_one_that_imports_it_back():
    circles = []
    for start in GRAPH:  # every module's own reach: small graph, plain search
        seen, todo = set(), list(GRAPH[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(GRAPH[name])
        if start in seen:
            circles.append(start)
    assert circles == []


def test_no_layer_imports_one_above_it():
    upward = sorted((a, b) for a, targets in GRAPH.items() for b in targets
                    if _layer(a) != "top" and _layer(b) != _layer(a)
                    and _layer(b) not in MAY_IMPORT[_layer(a)])
    assert upward == []


def test_no_layer_takes_a_private_name_of_another():
    taken = sorted((name, imported) for name in MODULES
                   for node in ast.walk(ast.parse(MODULES[name].read_text()))
                   if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nbddp")
                   and node.module in MODULES and _layer(node.module) != _layer(name)
                   for imported in [a.name for a in node.names if a.name.startswith("_")])
    assert taken == []
