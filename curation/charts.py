"""Inline SVG charts for the dashboard pages: geometry only (numbers), drawn by the templates
(templates/dashboard/_line_chart.html, optimization.html). No library, nothing to load.

Charts stretch to their container's width and keep a fixed height in pixels: y positions are
pixels, x positions are percentages (SVG takes both), so text never scales with the width and
stays readable from 390 px to 1440 px. Only the line itself sits in a stretched inner SVG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# The line chart's height (px) and its plot area: a tick label sits above each grid line at
# the left, the time labels below the plot. VIEW_W: the inner SVG's user width (stretched).
HEIGHT, TOP, BOTTOM, VIEW_W = 200, 22, 172, 600
# Time labels on the x axis, at most.
X_TICKS = 7


def nice_ticks(top: float, *, n: int = 4) -> list[float]:
    """Round tick values from 0 to at least ``top``: about ``n`` steps of 1, 2, 2.5 or 5 × 10^k
    (0, 5, 10, 15, 20 — never 0, 3.7, 7.4). The last tick is the scale's maximum."""
    if top <= 0:
        return [0, 1]
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if step < 1 and top >= 1:
        step = 1
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 6) for i in range(count + 1)]


def _num(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def line_chart(values: Sequence[float], *, labels: Sequence[str] = (), unit: str = "") -> dict[str, Any]:
    """A line (and filled area) through ``values``, evenly spaced, on a y axis of round ticks
    in ``unit``, with ``labels`` (one per value: the x axis's times) shown at most X_TICKS."""
    ticks = nice_ticks(max(values, default=0))
    top = ticks[-1]
    n = max(len(values) - 1, 1)
    plot_h = BOTTOM - TOP
    pts = [(VIEW_W * i / n, TOP + plot_h * (1 - v / top)) for i, v in enumerate(values)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    area = f"0,{BOTTOM} {line} {VIEW_W},{BOTTOM}" if pts else ""
    every = max(1, math.ceil(len(labels) / X_TICKS)) if labels else 1
    last = len(labels) - 1
    # The last label (now) always, and every `every`-th back from it; near an edge the label
    # hangs inward so it is never cut.
    x_ticks = []
    for k, i in enumerate(range(last, -1, -every)):
        pct = 100 * i / n
        anchor = "start" if pct < 6 else ("end" if pct > 94 else "middle")
        # minor: every other label, hidden on a narrow screen (claw.css)
        x_ticks.append({"x": f"{pct:.2f}", "label": labels[i], "anchor": anchor, "minor": k % 2 == 1})
    x_ticks.reverse()
    return {
        "height": HEIGHT,
        "top": TOP,
        "bottom": BOTTOM,
        "view_w": VIEW_W,
        "points": line,
        "area": area,
        "max": max(values, default=0),
        "scale_top": top,
        "unit": unit,
        "y_ticks": [{"y": f"{TOP + plot_h * (1 - t / top):.1f}", "label": _num(t)} for t in ticks],
        "x_ticks": x_ticks,
        "x_label_y": HEIGHT - 8,
        "values": list(values),
    }


def bar_chart(items: Sequence[tuple[str, float, float]], *, row: int = 40) -> dict[str, Any]:
    """Horizontal bars: (label, value, total) per item; each bar shows value of total (the
    light bar is the total, the dark one the value), all scaled to the largest total. Each
    row is its label and numbers (dark text on the card) above its bar."""
    top = max((t for _, _, t in items), default=0) or 1
    bars = [
        {
            "label": label,
            "y": i * row,
            # Strings: SVG wants a "." decimal point whatever the page's locale.
            "total_w": f"{100 * total / top:.2f}",
            "value_w": f"{100 * value / top:.2f}",
            "value": value,
            "total": total,
            "share": value / total if total else 0.0,
        }
        for i, (label, value, total) in enumerate(items)
    ]
    return {
        "height": max(len(bars), 1) * row,
        "bars": bars,
        "row": row,
        "text_y": 14,
        "bar_y": 20,
        "bar_h": 14,
    }


def timeline_chart(items: Sequence[dict[str, Any]], *, unit: str = "") -> dict[str, Any]:
    """Points on a time axis: each item ``{"at": datetime, "value": float | None, "label":
    str, "href": str}`` (a run's checkpoints: when, the mean reward of the data behind
    each), x by time (one item: the middle), y on the values' own range (negatives too;
    a flat range is widened by 1), a line through the points that have a value. Items
    without a value sit on the axis, hollow."""
    times = [i["at"] for i in items]
    t0 = min(times, default=None)
    span = max((max(times) - t0).total_seconds(), 1e-9) if times else 1.0
    values = [i["value"] for i in items if i["value"] is not None]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    plot_h = BOTTOM - TOP
    points = []
    for i in items:
        pct = 50.0 if len(items) == 1 else 100 * (i["at"] - t0).total_seconds() / span
        v = i["value"]
        y = TOP + plot_h * (1 - (v - lo) / (hi - lo)) if v is not None else BOTTOM
        points.append(
            {**i, "x": f"{pct:.2f}", "vx": f"{VIEW_W * pct / 100:.1f}", "y": f"{y:.1f}", "none": v is None}
        )
    line = " ".join(f"{p['vx']},{p['y']}" for p in points if not p["none"])
    ticks = [lo, (lo + hi) / 2, hi]
    return {
        "height": HEIGHT,
        "top": TOP,
        "bottom": BOTTOM,
        "view_w": VIEW_W,
        "points": points,
        "line": line,
        "unit": unit,
        "y_ticks": [
            {"y": f"{TOP + plot_h * (1 - (t - lo) / (hi - lo)):.1f}", "label": f"{t:.3g}"} for t in ticks
        ],
        "first": times[0] if times else None,
        "last": times[-1] if times else None,
        "x_label_y": HEIGHT - 8,
    }
