"""The ``Server-Timing`` header (W3C Server Timing): where an answer's time went, in ms.

The gateway's answers carry ``upstream`` and ``record`` (gateway/proxy/runner.py) and
``total`` (the lean handler, gateway/proxy/asgi.py); clients and benches read them back with
:func:`parse`. One place writes the format and one reads it."""

from __future__ import annotations

import re
from typing import Any

HEADER = "Server-Timing"


def metric(name: str, seconds: float) -> str:
    """One metric: ``name;dur=<ms, 3 decimals>``."""
    return f"{name};dur={1000 * seconds:.3f}"


def add(response: Any, *metrics: str) -> None:
    """Append ``metrics`` to the response's header (after any it already has)."""
    current = response.headers.get(HEADER)
    response.headers[HEADER] = ", ".join([current, *metrics] if current else metrics)


# A metric (split at ",") and a parameter (split at ";"): runs of anything but the separator and
# quotes, or quoted strings whole (``desc="a, b"``).
_METRICS = re.compile(r'(?:"(?:[^"\\]|\\.)*"|[^",])+')
_PARAMS = re.compile(r'(?:"(?:[^"\\]|\\.)*"|[^";])+')


def _parts(pattern: re.Pattern[str], text: str) -> list[str]:
    return [part.strip() for part in pattern.findall(text) if part.strip()]


def parse(header: str) -> dict[str, float]:
    """``upstream;dur=0.4, record;dur=0.7`` -> {"upstream": 0.4, "record": 0.7}, in order.
    As the header's grammar allows: parameters in any order, with spaces around ``;`` and
    quoted values (``cache;desc="hit, warm";dur=2``); a metric's first ``dur`` counts, and a
    metric without one, or whose ``dur`` is not a number, is left out."""
    out: dict[str, float] = {}
    for item in _parts(_METRICS, header):
        name, *params = _parts(_PARAMS, item)
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "dur":
                try:
                    out[name] = float(value.strip().strip('"'))
                except ValueError:
                    pass
                break
    return out
