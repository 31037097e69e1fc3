"""The package's import graph, read from its source with ``ast``.

Why not import-linter: its contracts cover the layers, but not "no import
circle longer than two modules", which needs the graph itself; one reader
of the graph serves both, with no new dependency. Every ``import``
statement counts wherever it sits -- inside a function too, as an import
there still ties the two modules together -- except those under
``if TYPE_CHECKING:``, which never run. An edge goes to the most specific
module named: ``from celery_durable.broker import keys`` is an edge to
``celery_durable.broker.keys``; ``from celery_durable.broker import X`` for
a name ``X`` is an edge to ``celery_durable.broker`` (its ``__init__``).

Run as a script to print the circles, both ways:
``python -m tests.unit.import_graph [path/to/celery_durable]``. Counted with
the type checkers' imports, the circles left are annotations naming
``Engine`` (in every task body) and ``Replay`` (in every op).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "celery_durable"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, annotations: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement; those under ``if TYPE_CHECKING:`` only with ``annotations``."""
    for node in ast.iter_child_nodes(tree):
        if not annotations and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(child, annotations)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node, annotations)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imported_names(module: str, path: Path, modules: dict[str, Path], annotations: bool = False) -> set[str]:
    """Dotted names this module imports: ``from a import b`` names ``a.b`` when
    that is a module of ours, else ``a``."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in _imports(tree, annotations):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        target = _absolute(module, path.name == "__init__.py", node)
        for alias in node.names:
            names.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
    return names


def graph(root: Path = ROOT, annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports (with ``annotations``, also
    those imported only for type checkers)."""
    modules = module_files(root)
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for name in imported_names(module, path, modules, annotations):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        edges[module] = targets
    return edges


def external_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> top-level names of the other distributions it imports."""
    modules = module_files(root)
    return {
        module: {n.split(".")[0] for n in imported_names(module, path, modules)} - {PACKAGE}
        for module, path in modules.items()
    }


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return sorted(found, key=len, reverse=True)


def importers(edges: dict[str, set[str]], source: str, target: str) -> list[tuple[str, str]]:
    """Edges from modules in ``source`` (a package or module) to ones in ``target``."""

    def inside(module: str, prefix: str) -> bool:
        return module == prefix or module.startswith(prefix + ".")

    return sorted((a, b) for a, bs in edges.items() if inside(a, source) for b in bs if inside(b, target))


if __name__ == "__main__":
    # python -m tests.unit.import_graph [PACKAGE_DIR]: the circles, largest first.
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    for annotations in (False, True):
        found = circles(graph(root, annotations))
        print("with TYPE_CHECKING imports" if annotations else "imports that run", [len(c) for c in found])
        for component in found[:2]:
            print("   ", len(component), sorted(component))
