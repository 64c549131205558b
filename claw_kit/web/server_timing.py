"""The ``Server-Timing`` header (W3C Server Timing): where an answer's time went, in ms.

The gateway's answers carry ``upstream`` and ``record`` (gateway/proxy/runner.py) and
``total`` (the lean handler, gateway/proxy/asgi.py); clients and benches read them back with
:func:`parse`. One place writes the format and one reads it."""

from __future__ import annotations

from typing import Any

HEADER = "Server-Timing"


def metric(name: str, seconds: float) -> str:
    """One metric: ``name;dur=<ms, 3 decimals>``."""
    return f"{name};dur={1000 * seconds:.3f}"


def add(response: Any, *metrics: str) -> None:
    """Append ``metrics`` to the response's header (after any it already has)."""
    current = response.headers.get(HEADER)
    response.headers[HEADER] = ", ".join([current, *metrics] if current else metrics)


def parse(header: str) -> dict[str, float]:
    """``upstream;dur=0.4, record;dur=0.7`` -> {"upstream": 0.4, "record": 0.7}, in order."""
    out: dict[str, float] = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        out[name] = float(dur)
    return out
