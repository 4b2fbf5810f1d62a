"""Charts as inline SVG drawn on the server, each with a text equivalent (title, summary, table).

No JavaScript and no external library: the page works without scripts and a screen reader gets
the same facts as a sighted reader.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from datetime import datetime
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT = 640, 180
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 52, 12, 12, 26
MAX_MARKERS = 120  # above this, a line alone (one circle per point would bloat the page)


def summary(values: list[float], fmt: Callable[[float], str]) -> str:
    if not values:
        return "no measurements"
    return (f"{len(values)} measurements; lowest {fmt(min(values))}, median {fmt(statistics.median(values))}, "
            f"highest {fmt(max(values))}, latest {fmt(values[-1])}")


def line_chart(chart_id: str, title: str, points: list[tuple[datetime, float]],
               fmt: Callable[[float], str], *, baseline: float | None = None) -> Markup:
    """An SVG line chart of ``points`` (oldest first). ``baseline`` draws a reference line (1x)."""
    values = [v for _, v in points]
    desc = summary(values, fmt)
    if points:
        desc += f", from {points[0][0]:%Y-%m-%d} to {points[-1][0]:%Y-%m-%d}"
    head = (f'<svg class="chart" id="{chart_id}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-labelledby="{chart_id}-title {chart_id}-desc" preserveAspectRatio="xMidYMid meet">'
            f'<title id="{chart_id}-title">{escape(title)}</title><desc id="{chart_id}-desc">{escape(desc)}</desc>')
    if not points:
        return Markup(head + f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="chart-empty">'
                             "no measurements yet</text></svg>")
    lo, hi = min(values), max(values)
    if baseline is not None:
        lo, hi = min(lo, baseline), max(hi, baseline)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5 * (abs(lo) or 1), hi + 0.5 * (abs(hi) or 1)
    margin = (hi - lo) * 0.08
    lo, hi = lo - margin, hi + margin
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM
    n = len(points)

    def x(i: int) -> float:
        return PAD_LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return PAD_TOP + plot_h * (1 - (v - lo) / (hi - lo))

    parts = [head]
    for k in range(3):  # three grid lines with labels
        v = lo + (hi - lo) * (k + 0.5) / 3
        parts.append(f'<line class="grid" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>'
                     f'<text class="tick" x="{PAD_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{escape(fmt(v))}</text>')
    if baseline is not None:
        parts.append(f'<line class="baseline" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" '
                     f'y1="{y(baseline):.1f}" y2="{y(baseline):.1f}"/>')
    path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f'<polyline class="series" points="{path}"/>')
    if n <= MAX_MARKERS:
        for i, (at, v) in enumerate(points):
            parts.append(f'<circle class="marker" cx="{x(i):.1f}" cy="{y(v):.1f}" r="3">'
                         f"<title>{at:%Y-%m-%d %H:%M}: {escape(fmt(v))}</title></circle>")
    parts.append(f'<text class="tick" x="{PAD_LEFT}" y="{HEIGHT - 6}">{points[0][0]:%Y-%m-%d}</text>'
                 f'<text class="tick" x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 6}" text-anchor="end">'
                 f"{points[-1][0]:%Y-%m-%d}</text></svg>")
    return Markup("".join(parts))


def sparkline(values: list[int], label: str, width: int = 120, height: int = 24) -> Markup:
    """A tiny inline SVG of ``values`` (oldest first) labelled for screen readers by ``label``."""
    head = (f'<svg class="sparkline" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{escape(label)}">')
    if not values:
        return Markup(head + "</svg>")
    top = max(max(values), 1)
    step = (width - 4) / max(len(values) - 1, 1)
    points = [(2 + i * step, height - 2 - (height - 4) * v / top) for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    last_x, last_y = points[-1]
    return Markup(head + f'<polyline points="{path}" class="spark-line"/>'
                         f'<circle cx="{last_x:.1f}" cy="{last_y:.1f}" r="2.5" class="spark-dot"/></svg>')
