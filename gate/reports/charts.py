"""Server-rendered SVG charts: no JavaScript, no CDN, readable offline and in any mail client.

Pure functions from arrays to SVG text; every label passes through `escape`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

import numpy as np
import numpy.typing as npt

COLORS = {"reference": "#3566a8", "candidate": "#d9622b"}
W, H = 560, 260
ML, MR, MT, MB = 56, 16, 28, 40
MAX_POINTS = 400


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    out = []
    v = start
    while v <= hi + 1e-12:
        out.append(round(v, 10))
        v += step
    return out


def _frame(
    title: str,
    xlabel: str,
    ylabel: str,
    x0: float,
    x1: float,
    y0: float,
    y1: float,
    body: list[str],
    legend: Sequence[str],
) -> str:
    pw, ph = W - ML - MR, H - MT - MB

    def sx(x: float) -> float:
        return ML + (x - x0) / (x1 - x0 or 1) * pw

    def sy(y: float) -> float:
        return MT + ph - (y - y0) / (y1 - y0 or 1) * ph

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" '
        f'aria-label="{escape(title)}" class="chart">',
        f"<title>{escape(title)}</title>",
        f'<text x="{ML}" y="16" class="chart-title">{escape(title)}</text>',
        f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" class="plot"/>',
    ]
    for t in _ticks(x0, x1):
        x = sx(t)
        parts.append(f'<line x1="{x:.1f}" y1="{MT}" x2="{x:.1f}" y2="{MT + ph}" class="grid"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{MT + ph + 14}" class="tick" text-anchor="middle">'
            f"{_fmt(t)}</text>"
        )
    for t in _ticks(y0, y1, 4):
        y = sy(t)
        parts.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{ML - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>'
        )
    parts.append(
        f'<text x="{ML + pw / 2}" y="{H - 6}" class="axis" text-anchor="middle">'
        f"{escape(xlabel)}</text>"
    )
    parts.append(
        f'<text x="14" y="{MT + ph / 2}" class="axis" text-anchor="middle" '
        f'transform="rotate(-90 14 {MT + ph / 2})">{escape(ylabel)}</text>'
    )
    parts.extend(body)
    for i, name in enumerate(legend):
        lx = ML + pw - 150 + (i % 2) * 80
        color = COLORS.get(name, "#555")
        parts.append(f'<rect x="{lx}" y="8" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 14}" y="17" class="tick">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def cdf_chart(
    series: Mapping[str, npt.NDArray[np.float64]],
    title: str,
    unit: str,
    quantiles: Sequence[float] = (0.5, 0.9, 0.99),
) -> str:
    """Empirical CDFs overlaid, with dashed markers at the quantiles the judge looks at."""
    data = {k: np.sort(v[np.isfinite(v)]) for k, v in series.items()}
    data = {k: v for k, v in data.items() if v.size}
    if not data:
        return _empty(title)
    allv = np.concatenate(list(data.values()))
    x0 = float(np.quantile(allv, 0.0))
    x1 = float(np.quantile(allv, 0.999))
    pad = (x1 - x0) * 0.05 or max(abs(x1) * 0.05, 1e-3)
    x0, x1 = max(0.0, x0 - pad), x1 + pad
    pw, ph = W - ML - MR, H - MT - MB
    body = []
    for name, v in data.items():
        color = COLORS.get(name, "#555")
        n = v.size
        idx = np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).astype(int))
        pts = []
        for i in idx:
            x = ML + (min(float(v[i]), x1) - x0) / (x1 - x0) * pw
            y = MT + ph - (i + 1) / n * ph
            pts.append(f"{x:.1f},{y:.1f}")
        body.append(
            f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" stroke-width="2"/>'
        )
        for q in quantiles:
            if n * (1 - q) < 1:
                continue
            qv = float(np.quantile(v, q))
            if qv > x1:
                continue
            x = ML + (qv - x0) / (x1 - x0) * pw
            y = MT + ph - q * ph
            body.append(
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{MT + ph}" stroke="{color}" '
                f'stroke-dasharray="3 3" stroke-width="1"><title>{escape(name)} p{q * 100:g} = '
                f"{qv:.2f} {escape(unit)}</title></line>"
            )
    return _frame(title, unit, "fraction of requests", x0, x1, 0.0, 1.0, body, list(data))


def scatter_chart(
    series: Mapping[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]],
    title: str,
    xlabel: str,
    ylabel: str,
    markers: Sequence[tuple[str, float]] = (),
) -> str:
    """Per-request latency against send time: drift, bursts and overload show as shapes."""
    data = {k: (x, y) for k, (x, y) in series.items() if x.size}
    if not data:
        return _empty(title)
    allx = np.concatenate([x for x, _ in data.values()])
    ally = np.concatenate([y for _, y in data.values()])
    x0, x1 = 0.0, float(allx.max()) or 1.0
    y0, y1 = 0.0, float(np.quantile(ally, 0.995)) * 1.1 or 1.0
    pw, ph = W - ML - MR, H - MT - MB
    body = []
    for name, (x, y) in data.items():
        color = COLORS.get(name, "#555")
        step = max(1, x.size // 1500)
        pts = []
        for xi, yi in zip(x[::step], y[::step], strict=False):
            px = ML + (float(xi) - x0) / (x1 - x0) * pw
            py = MT + ph - (min(float(yi), y1) - y0) / (y1 - y0) * ph
            pts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="1.6"/>')
        body.append(f'<g fill="{color}" fill-opacity="0.55">{"".join(pts)}</g>')
    for label, at in markers:
        if not x0 < at < x1:
            continue
        px = ML + (at - x0) / (x1 - x0) * pw
        body.append(
            f'<line x1="{px:.1f}" y1="{MT}" x2="{px:.1f}" y2="{MT + ph}" stroke="#57606a" '
            f'stroke-dasharray="4 3"/><text x="{px + 3:.1f}" y="{MT + 10}" class="tick">'
            f"{escape(label)}</text>"
        )
    return _frame(title, xlabel, ylabel, x0, x1, y0, y1, body, list(data))


PHASE_COLORS = {
    "launched": "#c6dbef",
    "attached": "#c6dbef",
    "process_up": "#9ecae1",
    "pods_scheduled": "#9ecae1",
    "image_pulled": "#85bcdb",
    "started": "#78b4d8",
    "port_open": "#6baed6",
    "healthy": "#4292c6",
    "model_listed": "#2171b5",
    "warmup_done": "#08519c",
    "ready": "#08306b",
}


def timeline_chart(phases: Mapping[str, Mapping[str, float]], title: str) -> str:
    """Each engine's way to ready as stacked segments on the gate's clock: a segment is the time
    spent reaching the phase that ends it, so the long bar is where startup time went."""
    rows = [
        (role, {k: v for k, v in ph.items() if k in PHASE_COLORS}) for role, ph in phases.items()
    ]
    rows = [(role, ph) for role, ph in rows if ph]
    if not rows:
        return _empty(title)
    t1 = max(max(ph.values()) for _, ph in rows) or 1.0
    left, row_h, top = 90, 34, 30
    pw = W - left - 56  # room for the total at the end of each bar
    legend_y = top + row_h * len(rows) + 26
    height = legend_y + 56
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" role="img" '
        f'aria-label="{escape(title)}" class="chart timeline">',
        f"<title>{escape(title)}</title>",
        f'<text x="{ML}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    for t in _ticks(0.0, t1):
        x = left + t / t1 * pw
        parts.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{legend_y - 18}" class="grid"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{legend_y - 6}" class="tick" text-anchor="middle">'
            f"{_fmt(t)}s</text>"
        )
    for r, (role, ph) in enumerate(rows):
        y = top + r * row_h
        parts.append(f'<text x="8" y="{y + 15}" class="axis">{escape(role)}</text>')
        prev = 0.0
        for name, at in sorted(ph.items(), key=lambda kv: kv[1]):
            x_a, x_b = left + prev / t1 * pw, left + at / t1 * pw
            parts.append(
                f'<rect x="{x_a:.1f}" y="{y}" width="{max(x_b - x_a, 1.5):.1f}" height="20" '
                f'fill="{PHASE_COLORS[name]}"><title>{escape(role)}: {escape(name)} at '
                f"{at:.3f}s (+{at - prev:.3f}s)</title></rect>"
            )
            prev = at
        parts.append(
            f'<text x="{left + prev / t1 * pw + 4:.1f}" y="{y + 15}" '
            f'class="tick">{prev:.2f}s</text>'
        )
    x, ly = float(left), legend_y + 8
    present = {name for _, ph in rows for name in ph}
    for name, color in PHASE_COLORS.items():
        if name not in present:
            continue
        width = 14 + 6.2 * len(name) + 10
        if x + width > W - MR:
            x, ly = float(left), ly + 16
        parts.append(f'<rect x="{x:.0f}" y="{ly}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 13:.0f}" y="{ly + 9}" class="tick">{escape(name)}</text>')
        x += width
    parts.append("</svg>")
    return "".join(parts)


def _empty(title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} 60" role="img" '
        f'aria-label="{escape(title)}" class="chart"><title>{escape(title)}</title>'
        f'<text x="{ML}" y="34" class="axis">{escape(title)}: no data</text></svg>'
    )
