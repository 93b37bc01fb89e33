"""The capacity scenarios in the report: the knee charts (goodput, TTFT and ITL against
offered rate, both engines, as vLLM's `bench sweep` and guidellm's sweep plot them) and the
search step by step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from markupsafe import Markup

from gate.core.vocabulary import ROLES
from gate.reports.charts import COLORS, MUTED, Line, line_chart
from gate.verdict.document import CapacityDoc, CapacityEngineDoc, VerdictDocument

Pick = Callable[[CapacityEngineDoc], float | None]


def _by_rate(cap: CapacityDoc, role: str, pick: Pick) -> tuple[np.ndarray, np.ndarray]:
    """Each offered rate once (repeats averaged), in rising order."""
    values: dict[float, list[float]] = {}
    for step in cap.steps:
        v = pick(step.reference if role == "reference" else step.candidate)
        if v is not None:
            values.setdefault(step.rate, []).append(v)
    rates = sorted(values)
    return np.asarray(rates, np.float64), np.asarray(
        [float(np.mean(values[r])) for r in rates], np.float64
    )


def _chart(cap: CapacityDoc, pick: Pick, what: str, unit: str, target: float | None) -> Markup:
    lines = [Line(role, COLORS.get(role, MUTED), *_by_rate(cap, role, pick)) for role in ROLES]
    if target is not None and cap.steps:
        top = max(s.rate for s in cap.steps)
        lines.append(
            Line(f"target {target:.0%}", MUTED, np.array([0.0, top]), np.array([target] * 2), True)
        )
    title = f"{cap.name}: {what} against offered rate"
    desc = f"{what} of each engine at each offered rate of the capacity search ({unit})"
    return Markup(
        line_chart(lines, title, "offered rate (requests/s)", unit, kind="knee", desc=desc)
    )


def knee_charts(cap: CapacityDoc) -> list[Markup]:
    return [
        _chart(
            cap, lambda e: e.goodput, "goodput", "share of requests meeting the SLO", cap.target
        ),
        _chart(cap, lambda e: e.ttft_p50_ms, "TTFT p50", "ms", None),
        _chart(cap, lambda e: e.itl_p50_ms, "ITL p50", "ms", None),
    ]


def _row(step: Any) -> dict[str, Any]:
    def side(e: CapacityEngineDoc) -> str:
        ttft = f"{e.ttft_p50_ms:.0f}" if e.ttft_p50_ms is not None else "–"
        return f"{e.goodput:.1%} ({e.good}/{e.sent}) · TTFT p50 {ttft} ms"

    return {
        "rate": f"{step.rate:.3g}",
        "stage": step.stage,
        "reference": side(step.reference),
        "candidate": side(step.candidate),
    }


def capacity_sections(doc: VerdictDocument) -> list[dict[str, Any]]:
    """One section per capacity scenario: its search in words, its knee charts, its steps."""
    out: list[dict[str, Any]] = []
    for i, cap in enumerate(doc.capacity or []):
        out.append(
            {
                "name": cap.name,
                "anchor": f"capacity-{i + 1}",
                "meta": (
                    f"{len(cap.steps)} paired steps in {cap.duration_s:.0f} s · goodput target "
                    f"{cap.target:.0%} with {cap.slo} · resolution {cap.resolution:.0%} · "
                    f"{cap.stopped or 'search ended'}"
                ),
                "aborted": cap.aborted,
                "charts": knee_charts(cap),
                "steps": [_row(s) for s in sorted(cap.steps, key=lambda s: s.rate)],
            }
        )
    return out
