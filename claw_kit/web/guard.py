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

import re
from typing import Any

from django.conf import settings

_SCALARS = frozenset({str, int, float, bool, type(None)})
# Never in an identifier (a uid, a name, a path segment, a query value, a header value): C0
# controls, DEL and C1 controls; U+2028/U+2029 (line and paragraph separators: no HTTP header
# can carry them, and JavaScript reads them as line ends); bidi controls (U+061C, U+200E/F,
# U+202A-202E, U+2066-2069), which make a uid read differently from what it is; zero-width
# characters (U+200B-200D, U+2060, U+FEFF), which make two uids look the same.
_NOT_IN_IDENT = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]")
# Never in any text: NUL (PostgreSQL's text and jsonb refuse it) and lone surrogates (no UTF-8
# can encode them).
_NOT_IN_TEXT = re.compile("[\x00\ud800-\udfff]")


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
    """Why ``value`` is no identifier (blank, or holding a character of ``_NOT_IN_IDENT``),
    else None."""
    if not value.strip():
        return "must not be blank"
    return chars_problem(value)


def chars_problem(value: str) -> str | None:
    """``ident_problem`` without the blank rule (a query value may be empty): why ``value``
    holds a character no identifier may hold, naming it, else None."""
    if value.isascii() and value.isprintable():  # the common case, in C
        return None
    found = _NOT_IN_IDENT.search(value)
    if found is None:
        return None
    return (
        f"must not contain control, line-separator, bidi or zero-width characters "
        f"(U+{ord(found.group()):04X} at {found.start()})"
    )


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as free text (a description, a note), else None."""
    found = _NOT_IN_TEXT.search(value)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain NUL characters"
    return f"must not contain lone surrogates (U+{ord(found.group()):04X} at {found.start()})"
