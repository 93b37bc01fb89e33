"""One scenario's charts, from the stored per-request columns: TTFT and ITL as CDFs and over
time, throughput and goodput against the sent rate, and when requests failed.

Latency charts leave the warm-up out, as the judge does; throughput, goodput and errors show
everything that was sent. Goodput counts a request that succeeded and met each SLO the
scenario set (`slos_of`), as the capacity search does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from markupsafe import Markup

from gate.analysis.samples import ERROR_KINDS, Columns, drop_warmup
from gate.reports.charts import (
    COLORS,
    MUTED,
    Array,
    Line,
    cdf_chart,
    error_timeline,
    line_chart,
    scatter_chart,
)
from gate.verdict.document import ScenarioDoc


def slos_of(sc: ScenarioDoc) -> dict[str, float]:
    """The scenario's SLOs (ttft_ms, itl_ms, e2e_ms) when its run summaries name any."""
    for side in (sc.reference, sc.candidate):
        found = side.goodput.slos if side.goodput is not None else None
        if found:
            return {k: float(v) for k, v in found.items() if k in ("ttft_ms", "itl_ms", "e2e_ms")}
    return {}


def _good(c: Columns, slos: Mapping[str, float]) -> Any:
    good = c.ok.copy()
    with np.errstate(invalid="ignore"):
        if "ttft_ms" in slos:
            good &= (c.first_token_ns >= 0) & (
                (c.first_token_ns - c.sent_ns) / 1e6 <= slos["ttft_ms"]
            )
        if "itl_ms" in slos:
            good &= np.isnan(c.itl_mean_ns) | (c.itl_mean_ns / 1e6 <= slos["itl_ms"])
        if "e2e_ms" in slos:
            good &= (c.end_ns >= 0) & ((c.end_ns - c.sent_ns) / 1e6 <= slos["e2e_ms"])
    return good


def goodput_note(slos: Mapping[str, float]) -> str:
    if not slos:
        return "goodput counts every successful response (the scenario sets no SLO)"
    said = " and ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in slos.items())
    return f"goodput counts successful responses with {said}"


def _bucket_width(duration_s: float, target: int = 30) -> float:
    raw = duration_s / target
    for w in (0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0):
        if w >= raw:
            return w
    return 600.0


def _rate(times_s: Array, width: float, end_s: float) -> tuple[Array, Array]:
    """Events per second in buckets of `width` seconds (the last bucket by its real width)."""
    n = max(1, math.ceil(end_s / width))
    counts = np.bincount(np.clip((times_s // width).astype(np.int64), 0, n - 1), minlength=n)
    starts = np.arange(n) * width
    widths = np.minimum(width, np.maximum(end_s - starts, width * 0.25))
    return (starts + widths / 2).astype(np.float64), (counts / widths).astype(np.float64)


def scenario_charts(
    name: str,
    columns: Mapping[str, Columns],
    warmup: int,
    phases: Sequence[tuple[str, float]] = (),
    slos: Mapping[str, float] | None = None,
    duration_s: float | None = None,
) -> dict[str, Markup]:
    """Every chart of one scenario, in the order the report shows them."""
    slos = slos or {}
    cols = {role: drop_warmup(c, warmup) for role, c in columns.items()}
    ttft = {role: c.ttft_ms() for role, c in cols.items()}
    itl = {role: c.itl_ms() for role, c in cols.items()}
    ttft_time, itl_time = _latency_over_time(cols)
    # Throughput, goodput and errors describe everything that was sent, warm-up included.
    end_s = max(
        [duration_s or 0.0]
        + [float(c.end_ns.max()) / 1e9 for c in columns.values() if len(c) and c.end_ns.max() > 0]
        + [float(c.sent_ns.max()) / 1e9 for c in columns.values() if len(c)]
    )
    width = _bucket_width(end_s or 1.0)
    lines, good_desc = _throughput_lines(columns, slos, width, end_s)
    return {
        "ttft_cdf": Markup(cdf_chart(ttft, f"{name}: time to first token (CDF)", "ms")),
        "itl_cdf": Markup(
            cdf_chart(itl, f"{name}: inter-token latency (CDF of per-request means)", "ms")
        ),
        "ttft_time": Markup(
            scatter_chart(
                ttft_time, f"{name}: TTFT over time", "seconds into scenario", "ms", phases
            )
        ),
        "itl_time": Markup(
            scatter_chart(
                itl_time,
                f"{name}: inter-token latency over time",
                "seconds into scenario",
                "ms (per-request mean)",
                phases,
            )
        ),
        "throughput": Markup(
            line_chart(
                lines,
                f"{name}: throughput and goodput",
                f"seconds into scenario ({width:g} s buckets, by completion)",
                "requests/s",
                phases,
                kind="throughput",
                desc=good_desc,
            )
        ),
        "errors": Markup(
            error_timeline(_errors_over_time(columns), end_s, f"{name}: failed requests", phases)
        ),
    }


Series = dict[str, tuple[np.ndarray, np.ndarray]]


def _latency_over_time(cols: Mapping[str, Columns]) -> tuple[Series, Series]:
    """Per engine, (send time in s, TTFT in ms) and (send time, mean ITL in ms)."""
    ttft_time: Series = {}
    itl_time: Series = {}
    for role, c in cols.items():
        ok = c.ok & (c.first_token_ns >= 0)
        ttft_time[role] = (
            (c.sent_ns[ok] / 1e9).astype(np.float64),
            ((c.first_token_ns[ok] - c.sent_ns[ok]) / 1e6).astype(np.float64),
        )
        has = c.ok & ~np.isnan(c.itl_mean_ns)
        itl_time[role] = (
            (c.sent_ns[has] / 1e9).astype(np.float64),
            (c.itl_mean_ns[has] / 1e6).astype(np.float64),
        )
    return ttft_time, itl_time


def _throughput_lines(
    columns: Mapping[str, Columns], slos: Mapping[str, float], width: float, end_s: float
) -> tuple[list[Line], str]:
    """The sent rate, each engine's throughput (with SLOs) and goodput, and their summary."""
    lines: list[Line] = []
    first = next(iter(columns.values()), None)
    if first is not None and len(first):
        x, y = _rate((first.sent_ns / 1e9).astype(np.float64), width, end_s)
        lines.append(Line("sent (each engine)", "#8c959f", x, y, dash=True, width=1.6))
    for role, c in columns.items():
        color = COLORS.get(role, MUTED)
        done = c.end_ns >= 0
        if slos:
            at = (c.end_ns[c.ok & done] / 1e9).astype(np.float64)
            lines.append(Line(f"{role} throughput", color, *_rate(at, width, end_s), width=1.4))
        good = _good(c, slos) & done
        at = (c.end_ns[good] / 1e9).astype(np.float64)
        lines.append(Line(f"{role} goodput", color, *_rate(at, width, end_s), dash=bool(slos)))
    good_desc = (
        goodput_note(slos)
        + ": "
        + "; ".join(
            f"{role}: {int((_good(c, slos) & (c.end_ns >= 0)).sum())} good of {len(c)} sent"
            for role, c in columns.items()
        )
    )
    return lines, good_desc


def _errors_over_time(columns: Mapping[str, Columns]) -> dict[str, tuple[np.ndarray, list[str]]]:
    """Per engine, the send times of its failed requests and each one's kind."""
    errors = {}
    for role, c in columns.items():
        bad = c.error >= 0
        kinds = [ERROR_KINDS[int(k)] if 0 <= k < len(ERROR_KINDS) else "?" for k in c.error[bad]]
        errors[role] = ((c.sent_ns[bad] / 1e9).astype(np.float64), kinds)
    return errors
