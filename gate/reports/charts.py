"""Server-rendered SVG charts: no JavaScript, no CDN, readable offline and in any mail client.

Pure functions from arrays to SVG text; every label passes through `escape`. Each chart is an
`<svg role="img">` with an `aria-label` (its title, then what it shows in numbers), a `<title>`,
a `data-chart` kind, axis labels and a legend, so a screen reader and a test can find it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np
import numpy.typing as npt

COLORS = {
    "reference": "#3566a8",
    "candidate": "#d9622b",
    # the divergence view: the reference against the candidate, and against itself
    "reference vs candidate": "#d9622b",
    "reference vs itself": "#3566a8",
}
MUTED = "#57606a"
W, H = 560, 300
ML, MR, MT, MB = 60, 18, 52, 44
MAX_POINTS = 400
MAX_DOTS = 1500

Array = npt.NDArray[np.float64]


def _fmt(v: float) -> str:
    """A tick label: as few digits as the value needs (ticks are round numbers)."""
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    digits = 1 if abs(v) >= 10 else 2 if abs(v) >= 0.1 else 3
    return f"{v:.{digits}f}".rstrip("0").rstrip(".")


def _val(v: float) -> str:
    """A measured value in a label or tooltip: three significant figures."""
    if not math.isfinite(v):
        return str(v)
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


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


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Round values (1-2-5, or finer when the range is narrow) between lo and hi > 0."""
    for mults in ((1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)):
        out = [
            m * 10.0**k
            for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
            for m in mults
            if lo <= m * 10.0**k <= hi
        ]
        if len(out) >= 3:
            return out
    return _ticks(lo, hi)


@dataclass(frozen=True)
class Legend:
    label: str
    color: str
    style: str = "box"  # box | line | dash | dot


@dataclass(frozen=True)
class Axes:
    """Data to pixels for the plot area of a W x `height` chart."""

    x0: float
    x1: float
    y0: float
    y1: float
    xlog: bool = False
    height: int = H

    @property
    def pw(self) -> float:
        return W - ML - MR

    @property
    def ph(self) -> float:
        return self.height - MT - MB

    def sx(self, x: float) -> float:
        if self.xlog:
            a, b = math.log10(self.x0), math.log10(self.x1)
            return ML + (math.log10(max(x, self.x0)) - a) / (b - a or 1) * self.pw
        return ML + (x - self.x0) / (self.x1 - self.x0 or 1) * self.pw

    def sy(self, y: float) -> float:
        return MT + self.ph - (y - self.y0) / (self.y1 - self.y0 or 1) * self.ph


def _open(kind: str, title: str, desc: str, height: int, width: int = W) -> list[str]:
    label = f"{title}. {desc}" if desc else title
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}" class="chart" data-chart="{escape(kind)}">',
        f"<title>{escape(title)}</title>",
        f"<desc>{escape(desc)}</desc>" if desc else "",
        f'<text x="{ML}" y="20" class="chart-title">{escape(title)}</text>',
    ]


def _legend(entries: Sequence[Legend], y: float = 34, right: float = W - MR) -> list[str]:
    parts: list[str] = []
    x = float(ML)
    for e in entries:
        width = 26 + 6.4 * len(e.label) + 14
        if x + width > right and x > ML:
            x, y = float(ML), y + 15
        if e.style in ("line", "dash"):
            dash = ' stroke-dasharray="5 3"' if e.style == "dash" else ""
            parts.append(
                f'<line x1="{x:.0f}" y1="{y - 4}" x2="{x + 20:.0f}" y2="{y - 4}" '
                f'stroke="{e.color}" stroke-width="2.5"{dash}/>'
            )
        elif e.style == "dot":
            parts.append(f'<circle cx="{x + 10:.0f}" cy="{y - 4}" r="3.5" fill="{e.color}"/>')
        else:
            parts.append(
                f'<rect x="{x + 4:.0f}" y="{y - 10}" width="12" height="12" rx="2" '
                f'fill="{e.color}"/>'
            )
        parts.append(f'<text x="{x + 25:.0f}" y="{y}" class="legend">{escape(e.label)}</text>')
        x += width
    return parts


def _grid(ax: Axes, xlabel: str, ylabel: str, yticks: int = 4) -> list[str]:
    pw, ph = ax.pw, ax.ph
    parts = [f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" class="plot"/>']
    xt = _log_ticks(ax.x0, ax.x1) if ax.xlog else _ticks(ax.x0, ax.x1)
    for t in xt:
        x = ax.sx(t)
        parts.append(f'<line x1="{x:.1f}" y1="{MT}" x2="{x:.1f}" y2="{MT + ph}" class="grid"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{MT + ph + 15}" class="tick" text-anchor="middle">'
            f"{_fmt(t)}</text>"
        )
    for t in _ticks(ax.y0, ax.y1, yticks):
        y = ax.sy(t)
        parts.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{ML - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>'
        )
    parts.append(
        f'<text x="{ML + pw / 2}" y="{ax.height - 8}" class="axis" text-anchor="middle">'
        f"{escape(xlabel)}</text>"
    )
    parts.append(
        f'<text x="16" y="{MT + ph / 2}" class="axis" text-anchor="middle" '
        f'transform="rotate(-90 16 {MT + ph / 2})">{escape(ylabel)}</text>'
    )
    return parts


def _phase_marks(ax: Axes, markers: Sequence[tuple[str, float]]) -> list[str]:
    """Scenario phases as shaded bands (every other one) with their names along the top."""
    parts: list[str] = []
    inside = [(label, at) for label, at in markers if ax.x0 <= at < ax.x1]
    for i, (label, at) in enumerate(inside):
        px = ax.sx(at)
        end = inside[i + 1][1] if i + 1 < len(inside) else ax.x1
        if i % 2 == 1:
            parts.append(
                f'<rect x="{px:.1f}" y="{MT}" width="{ax.sx(end) - px:.1f}" height="{ax.ph}" '
                f'class="band"/>'
            )
        if at > ax.x0:
            parts.append(
                f'<line x1="{px:.1f}" y1="{MT}" x2="{px:.1f}" y2="{MT + ax.ph}" '
                f'stroke="{MUTED}" stroke-dasharray="4 3"/>'
            )
        room = max(1, int((ax.sx(end) - px - 8) / 6.6))  # characters that fit in the band
        shown = label if len(label) <= room else label[: max(1, room - 1)] + "…"
        parts.append(
            f'<text x="{px + 4:.1f}" y="{MT + 12}" class="phase">{escape(shown)}'
            f"<title>phase {escape(label)} from {_val(at)} s</title></text>"
        )
    return parts


def _svg(parts: Sequence[str]) -> str:
    return "".join([*parts, "</svg>"])


def cdf_chart(
    series: Mapping[str, Array],
    title: str,
    unit: str,
    quantiles: Sequence[float] = (0.5, 0.9, 0.99),
    verticals: Sequence[tuple[str, float]] = (),
    what: str = "requests",
) -> str:
    """Empirical CDFs of both engines overlaid, with the quantiles the judge looks at marked
    (a dotted level per quantile, a dashed drop to each engine's value). A long tail switches
    the x axis to a log scale, where a ratio between engines is a constant distance.
    `verticals`: labelled x values drawn across the plot (a threshold, a floor)."""
    data = {k: np.sort(v[np.isfinite(v)]) for k, v in series.items()}
    data = {k: v for k, v in data.items() if v.size}
    if not data:
        return _empty(title, "cdf")
    allv = np.concatenate(list(data.values()))
    lo, hi = float(allv.min()), float(np.quantile(allv, 0.999))
    hi = max([hi, *(x * 1.05 for _, x in verticals)])
    xlog = lo > 0 and hi / lo > 3.0
    if xlog:
        x0, x1 = lo / 1.15, hi * 1.15
    else:
        pad = (hi - lo) * 0.05 or max(abs(hi) * 0.05, 1e-3)
        x0, x1 = max(0.0, lo - pad), hi + pad
    ax = Axes(x0, x1, 0.0, 1.0, xlog)
    body: list[str] = []
    for q in quantiles:
        y = ax.sy(q)
        body.append(
            f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + ax.pw}" y2="{y:.1f}" class="qline"/>'
            f'<text x="{ML + ax.pw - 4}" y="{y - 3:.1f}" class="qlabel" text-anchor="end">'
            f"p{q * 100:g}</text>"
        )
    desc: list[str] = []
    for name, v in data.items():
        color = COLORS.get(name, MUTED)
        n = v.size
        idx = np.unique(np.linspace(0, n - 1, min(n, MAX_POINTS)).astype(int))
        pts = [f"{ax.sx(min(float(v[i]), x1)):.1f},{ax.sy((i + 1) / n):.1f}" for i in idx]
        body.append(
            f'<polyline points="{" ".join(pts)}" fill="none" stroke="{color}" stroke-width="2.2"/>'
        )
        said = []
        for q in quantiles:
            if n * (1 - q) < 1:
                continue
            qv = float(np.quantile(v, q))
            said.append(f"p{q * 100:g} {_val(qv)}")
            if qv > x1:
                continue
            x, y = ax.sx(qv), ax.sy(q)
            body.append(
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{MT + ax.ph}" '
                f'stroke="{color}" stroke-dasharray="3 3" stroke-width="1.2"/>'
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.2" fill="{color}" stroke="#fff">'
                f"<title>{escape(name)} p{q * 100:g} = {_val(qv)} {escape(unit)}</title></circle>"
            )
        desc.append(f"{name} ({n} {what}): {', '.join(said)} {unit}")
    for label, xv in verticals:
        x = ax.sx(xv)
        body.append(
            f'<line x1="{x:.1f}" y1="{MT}" x2="{x:.1f}" y2="{MT + ax.ph}" class="vmark" '
            f'stroke="{MUTED}" stroke-dasharray="6 3" stroke-width="1.5"/>'
            f'<text x="{x + 4:.1f}" y="{MT + 12}" class="qlabel">{escape(label)}</text>'
        )
        desc.append(f"{label} at {_val(xv)} {unit}")
    parts = _open("cdf", title, "; ".join(desc), H)
    parts += _legend([Legend(k, COLORS.get(k, MUTED), "line") for k in data])
    parts += _grid(ax, f"{unit} (log scale)" if xlog else unit, f"fraction of {what}")
    parts += body
    return _svg(parts)


def _rolling_median(x: Array, y: Array, x1: float, buckets: int = 30) -> list[tuple[float, float]]:
    edges = np.linspace(0.0, x1, buckets + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, buckets - 1)
    out = []
    for b in range(buckets):
        sel = y[which == b]
        if sel.size >= 3:
            out.append(((edges[b] + edges[b + 1]) / 2, float(np.median(sel))))
    return out


def scatter_chart(
    series: Mapping[str, tuple[Array, Array]],
    title: str,
    xlabel: str,
    ylabel: str,
    markers: Sequence[tuple[str, float]] = (),
) -> str:
    """Per-request latency against send time with a rolling median per engine: drift, bursts
    and overload show as shapes; the scenario's phases are shaded and named."""
    data = {k: (x, y) for k, (x, y) in series.items() if x.size}
    if not data:
        return _empty(title, "over-time")
    allx = np.concatenate([x for x, _ in data.values()])
    ally = np.concatenate([y for _, y in data.values()])
    x1 = float(allx.max()) or 1.0
    y1 = float(np.quantile(ally, 0.995)) * 1.1 or 1.0
    ax = Axes(0.0, x1, 0.0, y1)
    body = _phase_marks(ax, markers)
    desc = []
    for name, (x, y) in data.items():
        color = COLORS.get(name, MUTED)
        step = max(1, x.size // MAX_DOTS)
        dots = "".join(
            f'<circle cx="{ax.sx(float(xi)):.1f}" cy="{ax.sy(min(float(yi), y1)):.1f}" r="1.7"/>'
            for xi, yi in zip(x[::step], y[::step], strict=False)
        )
        body.append(f'<g fill="{color}" fill-opacity="0.45">{dots}</g>')
        med = _rolling_median(x, y, x1)
        if len(med) >= 2:
            pts = " ".join(f"{ax.sx(a):.1f},{ax.sy(min(b, y1)):.1f}" for a, b in med)
            body.append(
                f'<polyline points="{pts}" fill="none" stroke="#fff" stroke-width="4.5"/>'
                f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2.2"/>'
            )
        desc.append(f"{name}: median {_val(float(np.median(y)))} over {x.size} requests")
    legend = [Legend(k, COLORS.get(k, MUTED), "dot") for k in data]
    legend.append(Legend("line: rolling median", MUTED, "line"))
    parts = _open("over-time", title, "; ".join(desc), H)
    parts += _legend(legend)
    parts += _grid(ax, xlabel, ylabel)
    parts += body
    return _svg(parts)


@dataclass(frozen=True)
class Line:
    label: str
    color: str
    x: Array
    y: Array
    dash: bool = False
    width: float = 2.2


def line_chart(
    lines: Sequence[Line],
    title: str,
    xlabel: str,
    ylabel: str,
    markers: Sequence[tuple[str, float]] = (),
    kind: str = "lines",
    desc: str = "",
) -> str:
    """Rates over time (throughput, goodput, offered load): one polyline per series."""
    data = [ln for ln in lines if ln.x.size]
    if not data:
        return _empty(title, kind)
    x1 = max(float(ln.x.max()) for ln in data) or 1.0
    y1 = max(float(np.nanmax(ln.y)) for ln in data) * 1.12 or 1.0
    ax = Axes(0.0, x1, 0.0, y1)
    body = _phase_marks(ax, markers)
    for ln in data:
        pts = " ".join(
            f"{ax.sx(float(a)):.1f},{ax.sy(float(b)):.1f}"
            for a, b in zip(ln.x, ln.y, strict=True)
            if math.isfinite(float(b))
        )
        dash = ' stroke-dasharray="6 4"' if ln.dash else ""
        body.append(
            f'<polyline points="{pts}" fill="none" stroke="{ln.color}" '
            f'stroke-width="{ln.width}" stroke-linejoin="round"{dash}/>'
        )
    legend = [Legend(ln.label, ln.color, "dash" if ln.dash else "line") for ln in data]
    parts = _open(kind, title, desc, H)
    parts += _legend(legend)
    parts += _grid(ax, xlabel, ylabel)
    parts += body
    return _svg(parts)


def bar_chart(
    edges: Sequence[float],
    counts: Sequence[int],
    title: str,
    xlabel: str,
    ylabel: str,
    kind: str = "bars",
    desc: str = "",
) -> str:
    """A histogram: `counts[i]` between `edges[i]` and `edges[i + 1]` (a workload's lengths,
    its arrivals per bin of time)."""
    if not counts or len(edges) != len(counts) + 1:
        return _empty(title, kind)
    x0, x1 = float(edges[0]), float(edges[-1])
    ax = Axes(x0, x1 if x1 > x0 else x0 + 1, 0.0, max(counts) * 1.12 or 1.0)
    body: list[str] = []
    for lo, hi, n in zip(edges[:-1], edges[1:], counts, strict=True):
        if not n:
            continue
        left, right, top = ax.sx(float(lo)), ax.sx(float(hi)), ax.sy(float(n))
        body.append(
            f'<rect x="{left:.1f}" y="{top:.1f}" width="{max(right - left - 1, 1):.1f}" '
            f'height="{ax.sy(0.0) - top:.1f}" fill="{MUTED}" fill-opacity="0.7">'
            f"<title>{_fmt(float(lo))}-{_fmt(float(hi))}: {n}</title></rect>"
        )
    parts = _open(kind, title, desc, H)
    parts += _grid(ax, xlabel, ylabel)
    parts += body
    return _svg(parts)


ERROR_COLORS = {
    "connect": "#8250df",
    "timeout": "#b42318",
    "http_4xx": "#9a6700",
    "http_5xx": "#cf222e",
    "stream_error": "#bc4c00",
    "protocol_error": "#6e7781",
    "truncated": "#0a7ea4",
}


def error_timeline(
    lanes: Mapping[str, tuple[Array, Sequence[str]]],
    duration_s: float,
    title: str,
    markers: Sequence[tuple[str, float]] = (),
) -> str:
    """One lane per engine, a tick at each failed request's send time coloured by error kind:
    whether errors came in a burst, all the time, or only after a phase change."""
    lane_h = 46
    height = MT + lane_h * max(1, len(lanes)) + MB
    x1 = max([duration_s, *[float(t.max()) for t, _ in lanes.values() if t.size]], default=1.0)
    ax = Axes(0.0, x1 or 1.0, 0.0, 1.0, height=height)
    kinds = sorted({k for _, ks in lanes.values() for k in ks})
    total = sum(len(ks) for _, ks in lanes.values())
    desc = "; ".join(
        f"{role}: {len(ks)} failed"
        + (f" ({', '.join(f'{k} {list(ks).count(k)}' for k in sorted(set(ks)))})" if ks else "")
        for role, (_, ks) in lanes.items()
    )
    parts = _open("errors", title, desc, height)
    legend = [Legend(k, ERROR_COLORS.get(k, MUTED)) for k in kinds] or [
        Legend("no failed requests", "#1a7f37")
    ]
    parts += _legend(legend)
    parts.append(f'<rect x="{ML}" y="{MT}" width="{ax.pw}" height="{ax.ph}" class="plot"/>')
    for label, at in markers:
        if ax.x0 < at < ax.x1:
            px = ax.sx(at)
            parts.append(
                f'<line x1="{px:.1f}" y1="{MT}" x2="{px:.1f}" y2="{MT + ax.ph}" '
                f'stroke="{MUTED}" stroke-dasharray="4 3"><title>phase {escape(label)} from '
                f"{_val(at)} s</title></line>"
            )
    for t in _ticks(ax.x0, ax.x1):
        x = ax.sx(t)
        parts.append(
            f'<text x="{x:.1f}" y="{MT + ax.ph + 15}" class="tick" text-anchor="middle">'
            f"{_fmt(t)}</text>"
        )
    parts.append(
        f'<text x="{ML + ax.pw / 2}" y="{height - 8}" class="axis" text-anchor="middle">'
        "seconds into scenario (send time of each failed request)</text>"
    )
    for i, (role, (times, ks)) in enumerate(lanes.items()):
        y = MT + i * lane_h
        if i:
            parts.append(f'<line x1="{ML}" y1="{y}" x2="{ML + ax.pw}" y2="{y}" class="grid"/>')
        parts.append(
            f'<text x="{ML + 6}" y="{y + 15}" class="lane">{escape(role)}: {len(ks)} failed</text>'
        )
        seen: set[tuple[int, str]] = set()
        for t, k in zip(times, ks, strict=False):
            px = round(ax.sx(float(t)))
            if (px, k) in seen:  # one tick per pixel and kind bounds the size
                continue
            seen.add((px, k))
            parts.append(
                f'<line x1="{px}" y1="{y + 20}" x2="{px}" y2="{y + lane_h - 4}" '
                f'stroke="{ERROR_COLORS.get(k, MUTED)}" stroke-width="2"/>'
            )
    if total == 0:
        parts.append(
            f'<text x="{ML + ax.pw / 2}" y="{MT + ax.ph / 2 + 5}" class="axis" '
            'text-anchor="middle">no request failed on either engine</text>'
        )
    return _svg(parts)


PHASE_COLORS = {
    "launched": "#c6dbef",
    "attached": "#c6dbef",
    "process_up": "#9ecae1",
    "config_resolved": "#fdd0a2",
    "weights_loaded": "#fdae6b",
    "warmed_up": "#fd8d3c",
    "kv_cache_sized": "#f16913",
    "engine_initialized": "#d94801",
    "api_up": "#a63603",
    "pods_scheduled": "#9ecae1",
    "image_pulled": "#85bcdb",
    "started": "#78b4d8",
    "port_open": "#6baed6",
    "healthy": "#4292c6",
    "model_listed": "#2171b5",
    "warmup_done": "#08519c",
    "ready": "#08306b",
}


def timeline_chart(phases: Mapping[str, Mapping[str, float]], title: str, width: int = 900) -> str:
    """Each engine's way to ready as stacked segments on the gate's clock: a segment is the time
    spent reaching the phase that ends it, so the long bar is where startup time went."""
    crashed = {role: ph["crashed"] for role, ph in phases.items() if "crashed" in ph}
    rows = [
        (role, {k: v for k, v in ph.items() if k in PHASE_COLORS}) for role, ph in phases.items()
    ]
    rows = [(role, ph) for role, ph in rows if ph]
    if not rows:
        return _empty(title, "lifecycle")
    t1 = max([max(ph.values()) for _, ph in rows] + list(crashed.values())) or 1.0
    left, row_h, top = 96, 36, 34
    pw = width - left - 70  # room for the total at the end of each bar
    axis_y = top + row_h * len(rows) + 4
    legend_y = axis_y + 50
    present = [name for name in PHASE_COLORS if any(name in ph for _, ph in rows)]
    per_row = sum(26 + 6.4 * len(n) + 14 for n in present)
    height = legend_y + 16 * (1 + int(per_row // (width - ML - MR))) + 4
    desc = "; ".join(
        f"{role}: "
        + ", ".join(f"{k} at {_val(v)} s" for k, v in sorted(ph.items(), key=lambda kv: kv[1]))
        for role, ph in rows
    )
    parts = _open("lifecycle", title, desc, height, width)
    for t in _ticks(0.0, t1, 8):
        x = left + t / t1 * pw
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y}" class="grid"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{axis_y + 14}" class="tick" text-anchor="middle">'
            f"{_fmt(t)} s</text>"
        )
    parts.append(
        f'<text x="{left + pw / 2}" y="{axis_y + 30}" class="axis" text-anchor="middle">'
        "seconds since the gate started</text>"
    )
    for r, (role, ph) in enumerate(rows):
        y = top + r * row_h
        parts.append(f'<text x="8" y="{y + 16}" class="axis">{escape(role)}</text>')
        prev = 0.0
        for name, at in sorted(ph.items(), key=lambda kv: kv[1]):
            x_a, x_b = left + prev / t1 * pw, left + at / t1 * pw
            parts.append(
                f'<rect x="{x_a:.1f}" y="{y}" width="{max(x_b - x_a, 1.5):.1f}" height="22" '
                f'fill="{PHASE_COLORS[name]}"><title>{escape(role)}: {escape(name)} at '
                f"{at:.3f} s (+{at - prev:.3f} s)</title></rect>"
            )
            prev = at
        parts.append(
            f'<text x="{left + prev / t1 * pw + 5:.1f}" y="{y + 16}" class="tick">'
            f"{prev:.2f} s</text>"
        )
        if role in crashed:
            cx = left + crashed[role] / t1 * pw
            parts.append(
                f'<line x1="{cx:.1f}" y1="{y - 3}" x2="{cx:.1f}" y2="{y + 25}" stroke="#b42318" '
                f'stroke-width="3"><title>{escape(role)} crashed at {crashed[role]:.3f} s'
                "</title></line>"
            )
    parts += _legend([Legend(n, PHASE_COLORS[n]) for n in present], y=legend_y, right=width - MR)
    return _svg(parts)


def interval_glyph(
    ratio: float | None,
    interval: tuple[float, float],
    threshold: float,
    scale: tuple[float, float],
    decision: str,
) -> str:
    """A check's decision at a glance: the ratio's interval as a bar on a shared scale, the
    threshold as a red tick and 1.0x (no change) as a grey one."""
    w, h, pad = 150, 20, 6
    lo_s, hi_s = scale

    def sx(v: float) -> float:
        return pad + (min(max(v, lo_s), hi_s) - lo_s) / (hi_s - lo_s or 1) * (w - 2 * pad)

    lo, hi = interval
    color = {"fail": "#b42318", "pass": "#1a7f37"}.get(decision, "#9a6700")
    r = f"{ratio:.3f}x, " if ratio is not None and math.isfinite(ratio) else ""
    label = f"ratio {r}interval {lo:.3f}x to {hi:.3f}x, threshold {threshold:.3f}x"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" '
        f'height="{h}" role="img" aria-label="{escape(label)}" class="glyph">',
        f'<line x1="{pad}" y1="{h / 2}" x2="{w - pad}" y2="{h / 2}" stroke="#d0d7de"/>',
        f'<line x1="{sx(1.0):.1f}" y1="3" x2="{sx(1.0):.1f}" y2="{h - 3}" stroke="{MUTED}"/>',
        f'<rect x="{sx(lo):.1f}" y="{h / 2 - 4}" width="{max(sx(hi) - sx(lo), 2):.1f}" '
        f'height="8" rx="3" fill="{color}" fill-opacity="0.8"/>',
        f'<line x1="{sx(threshold):.1f}" y1="1" x2="{sx(threshold):.1f}" y2="{h - 1}" '
        f'stroke="#b42318" stroke-width="2" stroke-dasharray="2 2"/>',
    ]
    if ratio is not None and math.isfinite(ratio):
        parts.append(f'<circle cx="{sx(ratio):.1f}" cy="{h / 2}" r="3" fill="#1b1f24"/>')
    parts.append("</svg>")
    return "".join(parts)


def _empty(title: str, kind: str = "empty") -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} 64" role="img" '
        f'aria-label="{escape(title)}: no data" class="chart" data-chart="{escape(kind)}">'
        f"<title>{escape(title)}</title>"
        f'<text x="{ML}" y="20" class="chart-title">{escape(title)}</text>'
        f'<text x="{ML}" y="46" class="axis">no data</text></svg>'
    )
