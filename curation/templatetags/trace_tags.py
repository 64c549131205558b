"""Template filters of the trace view: any JSON value as a collapsible tree (nested
<details>, keys sorted, strings quoted JSON-style: never a Python repr), and JSON
pretty-printed as text."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

# Containers with more entries than this start closed below the top level.
OPEN_UP_TO = 8
MAX_DEPTH = 40
# A list of more scalars than this (token ids, logprobs) is one line of JSON, not a row each.
INLINE_OVER = 24


def _scalar(value: Any) -> str:
    kind = (
        "null"
        if value is None
        else "b"
        if isinstance(value, bool)
        else "n"
        if isinstance(value, int | float)
        else "s"
    )
    text = json.dumps(value, ensure_ascii=False, default=str)
    return f'<span class="jt-{kind}">{escape(text)}</span>'


def _tree(value: Any, depth: int, open_all: bool) -> str:
    if isinstance(value, dict):
        items = [(json.dumps(str(k), ensure_ascii=False), value[k]) for k in sorted(value, key=str)]
        opener, closer = "{", "}"
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
        opener, closer = "[", "]"
    else:
        return _scalar(value)
    if not items:
        return f'<span class="jt-empty">{opener}{closer}</span>'
    if opener == "[" and len(items) > INLINE_OVER and not any(isinstance(v, dict | list) for _, v in items):
        text = json.dumps(list(value), ensure_ascii=False, default=str)
        return (
            f'<details class="jt"><summary>[<span class="jt-count">{len(items)} items</span>]</summary>'
            f'<code class="jt-inline">{escape(text)}</code></details>'
        )
    if depth >= MAX_DEPTH:
        return _scalar(json.dumps(value, ensure_ascii=False, default=str))
    unit = "key" if opener == "{" else "item"
    rows = "".join(
        f'<li><span class="jt-k">{escape(k)}</span>: {_tree(v, depth + 1, open_all)}</li>' for k, v in items
    )
    is_open = " open" if open_all or depth == 0 or len(items) <= OPEN_UP_TO else ""
    count = f"{len(items)} {unit}{'s' if len(items) != 1 else ''}"
    return (
        f'<details class="jt"{is_open}><summary>{opener}<span class="jt-count">{count}</span>{closer}</summary>'
        f'<ul class="jt-list">{rows}</ul></details>'
    )


@register.filter
def json_tree(value: Any) -> SafeString:
    """``value`` as a collapsible JSON tree (HTML, every text escaped)."""
    return mark_safe(f'<div class="json-tree">{_tree(value, 0, False)}</div>')  # noqa: S308 - escaped above


@register.filter
def json_pretty(value: Any) -> str:
    """``value`` as indented JSON text (keys sorted)."""
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)
