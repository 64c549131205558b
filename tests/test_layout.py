"""The layout's rules, read from the code's own imports (every import statement of a file,
at the top or inside a function, so a lazy import cannot hide an arrow):

* the rooms are layered: claw_client/ (the trainers' package, which also holds the prefix
  tree and the formats the server shares with trainers) imports nothing of the house, so it
  installs alone; claw_kit/ (shared infrastructure) imports no app; pool/ imports only
  claw_kit/ and claw_client/; gateway/ and curation/ import the pool and the kit, never each other; nothing
  but claw_site/ itself imports the composition root;
* no two files import each other, directly or round a longer circle.

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


def test_no_circle_between_files():
    # Tarjan's strongly connected components; a package's __init__ re-exporting its own
    # modules is not a circle unless a module imports the package back.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
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
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert circles == []
