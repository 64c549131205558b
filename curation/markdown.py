"""Markdown of the review guidelines, rendered safely: CommonMark with raw HTML off (a
``<script>`` an operator typed is shown as text), and links and images only to http(s) or
relative addresses (no ``javascript:``, ``data:``, ...). Links open in a new tab, without
the opener."""

from __future__ import annotations

import re

from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

_SCHEME = re.compile(r"^\s*([a-zA-Z][a-zA-Z0-9+.-]*):")


def _link_ok(url: str) -> bool:
    m = _SCHEME.match(url)
    return m is None or m.group(1).lower() in ("http", "https")


_md = MarkdownIt("commonmark", {"html": False})
_md.validateLink = _link_ok  # type: ignore[method-assign]


def _link_open(self, tokens, idx, options, env):  # type: ignore[no-untyped-def]
    tokens[idx].attrSet("target", "_blank")
    tokens[idx].attrSet("rel", "noopener noreferrer")
    return self.renderToken(tokens, idx, options, env)


_md.add_render_rule("link_open", _link_open)


def markdown_html(text: str) -> SafeString:
    """The HTML of ``text`` (Markdown); safe to put in a page as it is."""
    return mark_safe(_md.render(text or ""))  # noqa: S308 - html off, links checked above
