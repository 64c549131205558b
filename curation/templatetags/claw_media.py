"""Template tags for the images of steps (issue 24): the data of the two media includes, so
a page shows them with one include line and no change to its view.

    {% load claw_media %}{% step_media s.id as media %}{% include "curation/_media_thumbs.html" %}
    {% include "dashboard/_media_stats.html" %}   (it loads media_stats itself)
"""

from __future__ import annotations

from typing import Any

from django import template

from ..selectors.media import media_stats as _media_stats
from ..selectors.media import step_media as _step_media

register = template.Library()


@register.simple_tag
def step_media(step_id: int) -> list[dict[str, Any]]:
    """A step's images for display (curation.selectors.media.step_media)."""
    return _step_media(step_id)


@register.simple_tag
def media_stats() -> dict[str, int]:
    """Image counts and bytes saved by dedup (curation.selectors.media.media_stats)."""
    return _media_stats()
