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
    """``upstream;dur=0.4, record;dur=0.7`` -> {"upstream": 0.4, "record": 0.7}, in order.
    As the header's grammar allows: parameters in any order and with spaces around ``;``
    (``cache;desc="hit";dur=2``); a metric without ``dur`` (``miss``) is left out."""
    out: dict[str, float] = {}
    for item in header.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "dur":
                out[name] = float(value.strip())
                break
    return out
