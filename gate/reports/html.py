"""The gate report as one self-contained HTML file (inline CSS and SVG, no external fetch).

Everything an engine produced (log lines, error messages) is text to Jinja2 with autoescape on,
so a `<script>` in model output is shown, never run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from gate.reports.charts import cdf_chart, scatter_chart, timeline_chart
from gate.runs.samples import Columns, drop_warmup


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("gate.reports", "templates"),
        autoescape=select_autoescape(["html", "j2"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["ratio"] = lambda v: "" if v is None else f"{v:.3f}x"
    return env


def _num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def scenario_charts(
    name: str,
    columns: Mapping[str, Columns],
    warmup: int,
    phases: Sequence[tuple[str, float]] = (),
) -> dict[str, Markup]:
    cols = {role: drop_warmup(c, warmup) for role, c in columns.items()}
    ttft = {role: c.ttft_ms() for role, c in cols.items()}
    itl = {role: c.itl_ms() for role, c in cols.items()}
    over_time = {}
    for role, c in cols.items():
        ok = c.ok & (c.first_token_ns >= 0)
        over_time[role] = (
            (c.sent_ns[ok] / 1e9).astype(np.float64),
            ((c.first_token_ns[ok] - c.sent_ns[ok]) / 1e6).astype(np.float64),
        )
    return {
        "ttft_cdf": Markup(cdf_chart(ttft, f"{name}: time to first token", "ms")),
        "itl_cdf": Markup(cdf_chart(itl, f"{name}: inter-token latency (per-request mean)", "ms")),
        "ttft_time": Markup(
            scatter_chart(
                over_time, f"{name}: TTFT over time", "seconds into scenario", "ms", phases
            )
        ),
    }


def render_report(
    document: Mapping[str, Any], columns: Mapping[str, Mapping[str, Columns]], warmup: int = 0
) -> str:
    warm = warmup
    marks = {
        sc["name"]: [(p["name"], p["start_s"]) for p in sc.get("phases", [])]
        for sc in document.get("scenarios", [])
    }
    charts = {
        name: scenario_charts(name, cols, warm, marks.get(name, ()))
        for name, cols in columns.items()
    }
    phases = {role: e.get("phases", {}) for role, e in document.get("engines", {}).items()}
    timeline = Markup(timeline_chart(phases, "Engine lifecycle (seconds since the gate started)"))
    template = _env().get_template("report.html.j2")
    return template.render(
        doc=document,
        charts=charts,
        timeline=timeline,
        doc_json=json.dumps(document, indent=2, allow_nan=False),
    )


def write_report(
    document: Mapping[str, Any],
    columns: Mapping[str, Mapping[str, Columns]],
    path: Path,
    warmup: int = 0,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(document, columns, warmup), encoding="utf-8")
    path.with_suffix(".json").write_text(
        json.dumps(document, indent=2, allow_nan=False), encoding="utf-8"
    )
