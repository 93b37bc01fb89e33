"""The history page's charts (gate/web history), server-rendered SVG like the report's
(gate/reports/charts.py, whose axes, legend and grid they share): a spec's gates along x, oldest
to newest, so a person sees at a glance whether the reference drifts, whether one host is
noisier, how each check's ratio moves, and which gates held.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

from gate.reports.charts import ML, Axes, H, Legend, _empty, _grid, _legend, _open, _svg

SERIES_COLORS = ("#3566a8", "#d9622b", "#2e8b57", "#8a4fbf", "#b8860b", "#57606a")
HOST_MARKS = ("circle", "square", "diamond", "triangle")
FLAG = "#c62828"
STRIP_W = 1100  # the strip spans the page: its viewBox is as wide, so it is not scaled up
VERDICT_COLORS = {"continue": "#2e7d32", "hold": "#c62828"}


@dataclass(frozen=True)
class Point:
    """One gate's value: its place in the history (1 = oldest shown), the value, the host it
    ran on, and whether that gate flagged this figure as an outlier."""

    at: int
    value: float
    host: str = ""
    flagged: bool = False
    gate: str = ""


def _mark(kind: str, x: float, y: float, color: str, r: float = 3.6) -> str:
    """A point's mark: its shape tells the host it ran on."""
    if kind == "square":
        return (
            f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}" '
            f'fill="{color}"/>'
        )
    corners = {
        "diamond": [(0, -r - 1), (r + 1, 0), (0, r + 1), (-r - 1, 0)],
        "triangle": [(0, -r - 1), (r + 1, r), (-r - 1, r)],
    }.get(kind)
    if corners is not None:
        pts = " ".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in corners)
        return f'<polygon points="{pts}" fill="{color}"/>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{color}"/>'


def history_chart(
    series: Mapping[str, Sequence[Point]],
    title: str,
    ylabel: str,
    *,
    gates: int,
    reference_line: float | None = None,
    kind: str = "history",
) -> str:
    """One line per series over the gates; each point's shape is its host (when there are
    several), a red ring marks a gate that flagged the figure, `reference_line` a dashed
    horizontal line (a ratio of 1)."""
    data = {k: [p for p in v if math.isfinite(p.value)] for k, v in series.items()}
    data = {k: v for k, v in data.items() if v}
    if not data or gates < 1:
        return _empty(title, kind)
    values = [p.value for v in data.values() for p in v]
    lo, hi = min(values), max(values)
    if reference_line is not None:
        lo, hi = min(lo, reference_line), max(hi, reference_line)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    ax = Axes(0.5, gates + 0.5, max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)
    hosts = sorted({p.host for v in data.values() for p in v})
    shape = {h: HOST_MARKS[i % len(HOST_MARKS)] for i, h in enumerate(hosts)}
    body: list[str] = []
    if reference_line is not None:
        y = ax.sy(reference_line)
        body.append(
            f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + ax.pw}" y2="{y:.1f}" stroke="#1b1f24" '
            'stroke-dasharray="5 4"/>'
        )
    legend: list[Legend] = []
    flagged = 0
    for i, (label, pts) in enumerate(data.items()):
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        legend.append(Legend(label, color, "line"))
        line = " ".join(f"{ax.sx(p.at):.1f},{ax.sy(p.value):.1f}" for p in pts)
        body.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        for p in pts:
            x, y = ax.sx(p.at), ax.sy(p.value)
            tip = f"gate {p.at} {p.gate[:8]} on {p.host or '?'}: {label} {p.value:.3g}"
            body.append(f"<g>{_mark(shape[p.host] if len(hosts) > 1 else 'circle', x, y, color)}")
            if p.flagged:
                flagged += 1
                body.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="7" fill="none" stroke="{FLAG}" '
                    'stroke-width="2" class="flagged"/>'
                )
            body.append(f"<title>{escape(tip)}</title></g>")
    if flagged:
        legend.append(Legend("ring: reference outlier", FLAG, "dot"))
    if len(hosts) > 1:
        legend += [Legend(f"{shape[h]}: {h or '?'}", "#57606a", "dot") for h in hosts]
    desc = f"{gates} gates; " + "; ".join(
        f"{k}: first {v[0].value:.3g}, last {v[-1].value:.3g}" for k, v in data.items()
    )
    if flagged:
        desc += f"; {flagged} points flagged as reference outliers"
    parts = _open(kind, title, desc, H)
    parts += _legend(legend)
    parts += _grid(ax, "gate (oldest to newest)", ylabel)
    parts += body
    return _svg(parts)


def verdict_strip(verdicts: Sequence[tuple[str, bool, str]], title: str) -> str:
    """One square per gate, oldest first: green continue, red hold; A/A gates outlined."""
    if not verdicts:
        return _empty(title, "verdicts")
    n = len(verdicts)
    width = STRIP_W
    cell = min(22.0, (width - ML - 18) / n)
    held = sum(1 for v, _, _ in verdicts if v == "hold")
    aa = [v for v, is_aa, _ in verdicts if is_aa]
    desc = f"{n} gates, {held} held; {len(aa)} A/A gates, {aa.count('hold')} held"
    parts = _open("verdicts", title, desc, 84, width)
    parts += _legend(
        [
            Legend("continue", VERDICT_COLORS["continue"]),
            Legend("hold", VERDICT_COLORS["hold"]),
            Legend("outlined: A/A gate", "#1b1f24", "line"),
        ],
        right=width - 18,
    )
    for i, (verdict, is_aa, gate) in enumerate(verdicts):
        x = ML + i * cell
        outline = ' stroke="#1b1f24" stroke-width="2"' if is_aa else ""
        parts.append(
            f'<rect x="{x + 1:.1f}" y="46" width="{cell - 2:.1f}" height="24" rx="2" '
            f'fill="{VERDICT_COLORS.get(verdict, "#57606a")}"{outline}>'
            f"<title>gate {i + 1} {escape(gate[:8])}: {escape(verdict)}"
            f"{' (A/A)' if is_aa else ''}</title></rect>"
        )
    return _svg(parts)
