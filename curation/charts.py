"""Inline SVG charts for the dashboard pages: geometry only (numbers), drawn by the templates
(templates/dashboard/_line_chart.html, _bar_chart.html). No library, nothing to load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# viewBox of every chart; the SVG scales to its container's width.
WIDTH, HEIGHT, PAD = 600, 160, 4


def line_chart(values: Sequence[float], *, labels: Sequence[str] = ()) -> dict[str, Any]:
    """A line (and filled area) through ``values``, evenly spaced, scaled to the maximum."""
    top = max(values, default=0) or 1
    n = max(len(values) - 1, 1)
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    pts = [(PAD + inner_w * i / n, PAD + inner_h * (1 - v / top)) for i, v in enumerate(values)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    area = f"{PAD:.1f},{HEIGHT - PAD:.1f} {line} {WIDTH - PAD:.1f},{HEIGHT - PAD:.1f}" if pts else ""
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "points": line,
        "area": area,
        "max": max(values, default=0),
        "first": labels[0] if labels else "",
        "last": labels[-1] if labels else "",
        "values": list(values),
    }


def bar_chart(items: Sequence[tuple[str, float, float]], *, row: int = 22) -> dict[str, Any]:
    """Horizontal bars: (label, value, total) per item; each bar shows value of total (the
    light bar is the total, the dark one the value), all scaled to the largest total."""
    top = max((t for _, _, t in items), default=0) or 1
    label_w = 180
    inner = WIDTH - label_w - 60
    bars = [
        {
            "label": label,
            "y": i * row,
            # Strings: SVG wants a "." decimal point whatever the page's locale.
            "total_w": f"{inner * total / top:.1f}",
            "value_w": f"{inner * value / top:.1f}",
            "value": value,
            "total": total,
            "share": value / total if total else 0.0,
        }
        for i, (label, value, total) in enumerate(items)
    ]
    return {"width": WIDTH, "height": max(len(bars), 1) * row, "bars": bars, "label_w": label_w, "row": row}
