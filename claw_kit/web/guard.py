"""The input guard every door applies before anything reaches the upstream or the database:
the shape of decoded JSON / MessagePack (nesting depth, keys per object, items per array)
and identifiers (no control characters).

Limits are settings (docs/configuration.md, "Limits"): ``CLAW_MAX_JSON_DEPTH`` levels of nesting (the
top-level value is depth 1), ``CLAW_MAX_JSON_KEYS`` keys per object, ``CLAW_MAX_JSON_ITEMS``
items per array. The walk is iterative (a hostile body cannot exhaust the stack) and visits
containers only: an array of scalars (a token array) is typed in C and skipped whole.

What may be *stored* (NUL, NaN, 64-bit integers) is pool/ingest/rules.py's ``json_problem``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

_SCALARS = frozenset({str, int, float, bool, type(None)})
# C0 controls and DEL: never in an identifier (a uid, a path segment, a header value).
_CONTROLS = frozenset(chr(c) for c in (*range(0x20), 0x7F))


def limits() -> tuple[int, int, int]:
    """(max depth, max keys per object, max items per array), from the settings."""
    return settings.CLAW_MAX_JSON_DEPTH, settings.CLAW_MAX_JSON_KEYS, settings.CLAW_MAX_JSON_ITEMS


def shape_problem(value: Any, path: str = "", *, depth: int = 1) -> tuple[str, str] | None:
    """The first container of ``value`` nested deeper, or holding more keys or items, than
    the limits, as (its path, the reason); None when within them. ``depth``: the level of
    ``value`` in its body (a body is level 1)."""
    max_depth, max_keys, max_items = limits()
    stack: list[tuple[Any, str, int]] = [(value, path, depth)]
    while stack:
        v, at, depth = stack.pop()
        if depth > max_depth:
            return (at, f"nested deeper than {max_depth} levels")
        if isinstance(v, dict):
            if len(v) > max_keys:
                return (at, f"an object holds at most {max_keys} keys; got {len(v)}")
            if not _SCALARS.issuperset(map(type, v.values())):
                for k, item in v.items():
                    if type(item) not in _SCALARS:
                        stack.append((item, f"{at}.{k}" if at else str(k), depth + 1))
        elif isinstance(v, list | tuple):
            if len(v) > max_items:
                return (at, f"an array holds at most {max_items} items; got {len(v)}")
            if not _SCALARS.issuperset(map(type, v)):
                for i, item in enumerate(v):
                    if type(item) not in _SCALARS:
                        stack.append((item, f"{at}[{i}]", depth + 1))
    return None


def ident_problem(value: str) -> str | None:
    """Why ``value`` is no identifier (blank, or holding a control character), else None."""
    if not value.strip():
        return "must not be blank"
    if not _CONTROLS.isdisjoint(value):
        return "must not contain control characters"
    return None
