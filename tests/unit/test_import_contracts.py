"""The package's layout as contracts on its import graph (issue 37).

The core -- ``workflows`` (replay), ``tasks`` (Celery), ``broker`` (Redis),
``config`` -- sits beside the public face (the modules loose at the top),
the client side (``client/``) and the operator's surface (``web``, ``cli``,
``demo``). Each contract names a dependency that would undo it: replay that
needs Celery cannot be tested or run without a worker; a store that knows
the workflows cannot change apart from them; a surface that reaches past the
client into the store shows what the client cannot say. ``import_graph``
says how the graph is read.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.unit.import_graph import PACKAGE, ROOT, circles, external_imports, graph, importers

CORE = ("workflows", "tasks", "broker", "config")
SURFACES = ("web", "cli", "demo")
# What a surface may import besides the public API (``celery_durable`` and
# the modules loose beside it): the client side, the local processes it
# starts, the other surfaces (``cli web`` starts the web view), and
# telemetry's exposition (a worker's and the web view's /metrics).
SURFACE_MAY_USE = ("client", "local", "telemetry", *SURFACES)
LONGEST_CIRCLE = 2


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return graph()


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("workflows", "tasks"),
        ("broker", "workflows"),
        ("broker", "tasks"),
        *[(core, surface) for core in CORE for surface in (*SURFACES, "client")],
    ],
)
def test_forbidden_imports(edges: dict[str, set[str]], source: str, target: str) -> None:
    found = importers(edges, f"{PACKAGE}.{source}", f"{PACKAGE}.{target}")
    assert not found, f"{source} must not import {target}: " + ", ".join(f"{a} -> {b}" for a, b in found)


def test_workflows_import_no_celery() -> None:
    found = {
        module: names & {"celery", "kombu"}
        for module, names in external_imports().items()
        if _in(module, f"{PACKAGE}.workflows") and names & {"celery", "kombu"}
    }
    assert not found, f"workflows must not import Celery: {found}"


def public_face() -> set[str]:
    """The package itself and the modules loose at its top level."""
    return {PACKAGE} | {f"{PACKAGE}.{path.stem}" for path in ROOT.glob("*.py") if path.stem != "__init__"}


@pytest.mark.parametrize("surface", SURFACES)
def test_surfaces_use_the_client_and_the_public_api(edges: dict[str, set[str]], surface: str) -> None:
    allowed = public_face()
    found = [
        (a, b)
        for a, b in importers(edges, f"{PACKAGE}.{surface}", PACKAGE)
        if b not in allowed and not any(_in(b, f"{PACKAGE}.{name}") for name in SURFACE_MAY_USE)
    ]
    assert not found, f"{surface} reaches past the client: " + ", ".join(f"{a} -> {b}" for a, b in found)


def test_no_import_circle_longer_than_two(edges: dict[str, set[str]]) -> None:
    long = [sorted(c) for c in circles(edges) if len(c) > LONGEST_CIRCLE]
    assert not long, "import circles: " + "; ".join(f"{len(c)} modules: {', '.join(c)}" for c in long)


def test_importing_workflows_loads_no_celery() -> None:
    """Measured, not read: every module of ``workflows`` imported, and the
    package ``__init__`` (which runs first) must stay lazy."""
    code = (
        "import importlib, pkgutil, sys, celery_durable.workflows as w\n"
        "for m in pkgutil.iter_modules(w.__path__): importlib.import_module(f'{w.__name__}.{m.name}')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT.parent)
    assert out.stdout.strip() == "[]", f"importing celery_durable.workflows loads {out.stdout.strip()}"
