"""Test files, longest first: how `make test` keeps its workers busy to the end.

pytest-xdist's file scheduling (``--dist loadfile``) hands a worker the next whole file when it
frees up, in the order it is given, and by default orders files by how many tests they hold.
A file of one 40-second test then starts last and one worker runs it alone while the others
idle. Ordering files by how long they take (longest first, the classic LPT rule) ends the
workers within about the shortest file of each other. ``DURATIONS`` is what each file took in
CI's two passes (the larger of the two), measured from a JUnit report of each::

    make test PYTEST_ARGS="--junitxml=var/sqlite.xml"
    DATABASE_URL=... REDIS_URL=... make test PYTEST_ARGS="--junitxml=var/pg.xml"
    .venv/bin/python -m tests.durations var/sqlite.xml var/pg.xml

A file missing from it (a new one) counts a tenth of a second per test: ordering is only a
matter of speed, never of outcome.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

PATH = Path(__file__).with_name("durations.json")
PER_TEST = 0.1  # seconds, for a file with no measured duration


def load() -> dict[str, float]:
    try:
        return json.loads(PATH.read_text())
    except FileNotFoundError:
        return {}


def order(items: list, durations: dict[str, float]) -> None:
    """Reorder ``items`` in place: whole files, the longest first; the tests of a file keep
    their order (module-scoped fixtures start once)."""
    counts = Counter(item.nodeid.split("::", 1)[0] for item in items)

    def seconds(path: str) -> float:
        return durations.get(path, PER_TEST * counts[path])

    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::", 1)[0], i)
    items.sort(key=lambda it: (-seconds(f := it.nodeid.split("::", 1)[0]), first[f]))


def from_junit(paths: list[str]) -> dict[str, float]:
    """Seconds per test file, the largest over the reports."""
    out: dict[str, float] = {}
    for path in paths:
        per_file: Counter[str] = Counter()
        for case in ET.parse(path).getroot().iter("testcase"):
            module = case.get("classname", "").split("[", 1)[0]
            # classname is the dotted module (plus a class, for tests in a class)
            parts = module.split(".")
            while parts and not Path(*parts).with_suffix(".py").exists():
                parts.pop()
            if parts:
                per_file["/".join(parts) + ".py"] += float(case.get("time") or 0)
        for f, s in per_file.items():
            out[f] = max(out.get(f, 0.0), round(s, 1))
    return dict(sorted(out.items()))


if __name__ == "__main__":
    PATH.write_text(json.dumps(from_junit(sys.argv[1:]), indent=1) + "\n")
    print(f"wrote {PATH} ({len(load())} files)")
