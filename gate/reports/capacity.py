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
from gate.verdict.document import (
    CapacityDoc,
    CapacityEngineDoc,
    CapacityStepDoc,
    VerdictDocument,
)

Pick = Callable[[CapacityEngineDoc], float | None]
StepPick = Callable[[CapacityStepDoc], float | None]


def _mean_by_rate(cap: CapacityDoc, pick: StepPick) -> tuple[np.ndarray, np.ndarray]:
    """Each offered rate once (repeats averaged), in rising order; steps without a value
    left out."""
    values: dict[float, list[float]] = {}
    for step in cap.steps:
        if (v := pick(step)) is not None:
            values.setdefault(step.rate, []).append(v)
    rates = sorted(values)
    return np.asarray(rates, np.float64), np.asarray(
        [float(np.mean(values[r])) for r in rates], np.float64
    )


def _by_rate(cap: CapacityDoc, role: str, pick: Pick) -> tuple[np.ndarray, np.ndarray]:
    return _mean_by_rate(cap, lambda s: pick(s.reference if role == "reference" else s.candidate))


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


def _cpu_line(cap: CapacityDoc, name: str, color: str, pick: StepPick) -> Line | None:
    x, y = _mean_by_rate(cap, pick)
    return Line(name, color, x, y) if x.size else None


def _cpu_chart(cap: CapacityDoc) -> Markup | None:
    """The gate host's CPUs at each rate: the share of time some task waited for one (the
    judge's reading, against its limit: gate/analysis/capacity.py) and the share busy."""
    lines = [
        line
        for line in (
            _cpu_line(cap, "waited for a CPU", COLORS["candidate"], lambda s: s.cpu_stall),
            _cpu_line(cap, "CPUs busy", MUTED, lambda s: s.host_cpu),
        )
        if line is not None
    ]
    if not lines:
        return None
    if (limit := cap.cpu_stall_limit) is not None:
        edge = np.array([0.0, max(s.rate for s in cap.steps)])
        lines.append(Line(f"limit {limit:.0%}", MUTED, edge, np.array([limit] * 2), True))
    who = "both engines and the load generator" if cap.shares_host else "the load generator"
    return Markup(
        line_chart(
            lines,
            f"{cap.name}: the gate host's CPUs against offered rate",
            "offered rate (requests/s)",
            "share of the step",
            kind="knee",
            desc=(
                "share of each step's time in which some task waited for a CPU, and share of "
                f"the CPUs busy, on the gate's host ({who} ran there)"
            ),
        )
    )


def knee_charts(cap: CapacityDoc) -> list[Markup]:
    charts = [
        _chart(
            cap, lambda e: e.goodput, "goodput", "share of requests meeting the SLO", cap.target
        ),
        _chart(cap, lambda e: e.ttft_p50_ms, "TTFT p50", "ms", None),
        _chart(cap, lambda e: e.itl_p50_ms, "ITL p50", "ms", None),
    ]
    cpu = _cpu_chart(cap)
    return charts if cpu is None else [*charts, cpu]


def _row(step: Any) -> dict[str, Any]:
    def side(e: CapacityEngineDoc) -> str:
        ttft = f"{e.ttft_p50_ms:.0f}" if e.ttft_p50_ms is not None else "–"
        return f"{e.goodput:.1%} ({e.good}/{e.sent}) · TTFT p50 {ttft} ms"

    return {
        "rate": f"{step.rate:.3g}",
        "stage": step.stage,
        "reference": side(step.reference),
        "candidate": side(step.candidate),
        "host_cpu": " · ".join(
            f"{v:.0%} {what}"
            for v, what in ((step.cpu_stall, "waited"), (step.host_cpu, "busy"))
            if v is not None
        )
        or "–",
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
                "shares_host": cap.shares_host,
                "charts": knee_charts(cap),
                "steps": [_row(s) for s in sorted(cap.steps, key=lambda s: s.rate)],
            }
        )
    return out
