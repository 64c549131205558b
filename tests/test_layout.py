"""The layout's rules, read from the code's own imports (every import statement of a file,
at the top or inside a function, so a lazy import cannot hide an arrow):

* the rooms are layered: claw_client/ (the trainers' package, which also holds the prefix
  tree and the formats the server shares with trainers) imports nothing of the house, so it
  installs alone; claw_kit/ (shared infrastructure) imports no app; pool/ imports only
  claw_kit/ and claw_client/; gateway/ and curation/ import the pool and the kit, never each other; nothing
  but claw_site/ itself imports the composition root;
* no two files import each other, directly or round a longer circle, counting the packages
  Python runs before a module it imports (a package whose __init__ re-exports its modules is
  in a circle with each of them that imports a sibling); only the FACADES' __init__ modules
  import their own modules.

docs/architecture.md (Layout) draws the same picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("claw_client", "claw_kit", "pool", "gateway", "curation", "claw_site")

# What each room may import of the others (itself always).
ALLOWED = {
    "claw_client": set(),
    "claw_kit": set(),
    "pool": {"claw_kit", "claw_client"},
    "gateway": {"claw_kit", "pool", "claw_client"},
    "curation": {"claw_kit", "pool", "claw_client"},
    "claw_site": {"claw_client", "claw_kit", "pool", "gateway", "curation"},
}


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, Path]:
    out = {}
    for room in ROOMS:
        for path in (ROOT / room).rglob("*.py"):
            if "migrations" not in path.parts:
                out[_module_of(path)] = path
    return out


FILES = _files()


def _imports(module: str, path: Path) -> set[str]:
    """The modules of the house that ``path`` imports (``from a import b`` counts as a.b when
    a.b is a module of the house, else as a)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            names = [
                f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in FILES else stem for alias in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in FILES:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


GRAPH = {module: _imports(module, path) for module, path in FILES.items()}


def test_the_house_is_read_whole():
    # then: the walk saw every room and the well-known files in it (the rules below are not vacuous)
    assert {m.split(".")[0] for m in FILES} == set(ROOMS)
    for known in ("pool.sql", "pool.ingest.pipeline", "claw_kit.web.errors", "gateway.proxy.runner"):
        assert known in GRAPH
    assert "pool.sql" in GRAPH["pool.ingest.pipeline"]
    assert "claw_kit.web.errors" in GRAPH["gateway.proxy.runner"]


@pytest.mark.parametrize("room", ROOMS)
def test_imports_run_down_the_rooms(room):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == room
        for target in targets
        if target.split(".")[0] != room and target.split(".")[0] not in ALLOWED[room]
    )
    assert wrong == []


# Packages whose __init__ imports its own modules by design, so that importing one of those
# modules (which runs the __init__ first) is not counted as importing the package back; each
# for a reader outside the house:
FACADES = {
    "claw_client": "the package's published API (from claw_client import ClawClient)",
    "curation.admin": "what Django's admin autodiscovery imports to register every admin class",
    "pool.rewards": "the decorators a reward function's author imports (from pool.rewards import rule)",
    "claw_site": "the Celery app, loaded with Django as Celery's Django setup asks",
    "pool.models": "where Django loads the app's models from (one module per topic inside)",
}
# Every other package's __init__ is a docstring only.


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph as Python runs it: importing ``a.b.c`` runs ``a/__init__`` and
    ``a/b/__init__`` first, so a file importing it imports those packages too (but for a
    facade's own modules: see FACADES)."""
    out = {m: set(targets) for m, targets in graph.items()}
    for module, targets in graph.items():
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts)):
                package = ".".join(parts[:i])
                if package not in graph or package == module:
                    continue
                if package in FACADES and module.startswith(package + "."):
                    continue
                out[module].add(package)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_counts_a_package_that_re_exports_its_modules():
    # given a package whose __init__ re-exports a module that imports its sibling
    graph = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": set(), "q": {"p.a"}}
    # then the files alone hold no circle, but as Python runs them p and p.a import each other
    assert circles(graph) == []
    assert circles(with_packages(graph)) == [["p", "p.a"]]
    # and a package with a docstring-only __init__ holds none
    assert circles(with_packages({**graph, "p": set()})) == []


def test_no_circle_between_files():
    # every file and package __init__ of the house, each import of a module counting the
    # packages Python runs first
    assert circles(with_packages(GRAPH)) == []


def test_facades_are_the_only_packages_that_import_their_own_modules():
    packages = {m for m, path in FILES.items() if path.name == "__init__.py"}
    importing = {p for p in packages if any(t.startswith(p + ".") for t in GRAPH[p])}
    assert importing == set(FACADES)
