"""The gate report: one renderer for the self-contained HTML file (`gate run --report-dir`) and
the page `gate serve` shows at /gates/{id}.

`report_context` turns a verdict document and the stored per-request columns into plain view
data (formatted numbers, server-rendered SVG charts); `render_body` renders it with the
`_report.html.j2` template. The file wraps that body in `report.html.j2` (inline CSS, no
script, a CSP that forbids any); the service wraps the same body in its page with a nav bar.

Everything an engine produced (log lines, probe problems, model output in divergence
examples, error messages) is text to Jinja2 with autoescape on, so a `<script>` in model
output is shown, never run. Only the charts are markup, and they escape every label.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import BaseLoader, ChoiceLoader, Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from gate.analysis.samples import ERROR_KINDS, Columns, drop_warmup
from gate.core.vocabulary import ROLES, Role
from gate.reports.capacity import capacity_sections
from gate.reports.charts import (
    COLORS,
    MUTED,
    Array,
    Line,
    bar_chart,
    cdf_chart,
    error_timeline,
    interval_glyph,
    line_chart,
    scatter_chart,
    timeline_chart,
)
from gate.reports.telemetry import engine_config, telemetry_charts
from gate.verdict.document import (
    AbsDeltaDoc,
    Answered,
    CapabilitiesDoc,
    CheckDoc,
    DistributionDoc,
    EngineDoc,
    PlacementDoc,
    ScenarioDoc,
    VerdictDocument,
)
from gate.verdict.summary import Summary, summary_of

GROUPS = {
    "latency": "Latency",
    "errors": "Errors",
    "peak": "Peak load: goodput",
    "overload": "Overload: shedding or collapse",
    "recovery": "Recovery after overload",
    "capacity": "Capacity: the highest rate served within the SLO",
    "correctness": "Correctness",
    "startup": "Startup",
    "crash": "Crashes",
    "compatibility": "Compatibility",
    "gpu": "GPU memory, energy and errors",
}
# Groups shown open even when every check passed: what people look at first.
ALWAYS_OPEN = ("latency", "errors", "peak", "overload", "recovery", "capacity", "correctness")
# Groups whose values are fractions of requests and whose interval is a difference of them.
FRACTIONS = ("peak", "overload", "load")


def environment(*loaders: BaseLoader) -> Environment:
    """The report's Jinja2 environment; callers (the web pages) may put their own template
    folders in front of the report's, so their pages can extend and include its templates."""
    return _environment(tuple(loaders))


@lru_cache(maxsize=4)
def _environment(loaders: tuple[BaseLoader, ...]) -> Environment:
    env = Environment(
        loader=ChoiceLoader([*loaders, PackageLoader("gate.reports", "templates")]),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["ratio"] = lambda v: "" if v is None else f"{v:.3f}x"
    env.filters["when"] = format_time
    env.filters["seconds"] = _seconds
    return env


def _num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}" if math.isfinite(v) else str(v)
    return str(v)


def _seconds(v: Any) -> str:
    if not isinstance(v, int | float) or not math.isfinite(v):
        return "–"
    if v >= 120:
        return f"{int(v // 60)} min {v % 60:02.0f} s"
    return f"{v:.1f} s"


def format_time(v: Any) -> str:
    """An ISO timestamp (or datetime) as `2026-11-30 11:51:04 UTC`; anything else as is."""
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v)
        except ValueError:
            return str(v)
    if isinstance(v, datetime):
        if v.tzinfo is None:
            return v.strftime("%Y-%m-%d %H:%M:%S UTC")
        return v.strftime("%Y-%m-%d %H:%M:%S %Z").replace("+00:00", "UTC")
    return "–" if v is None else str(v)


# --------------------------------------------------------------------------- charts


def _phases_of(sc: ScenarioDoc) -> list[tuple[str, float]]:
    return [(p.name, float(p.start_s)) for p in sc.phases]


def _slos(sc: ScenarioDoc) -> dict[str, float]:
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


# --------------------------------------------------------------------------- view data


def _pct(v: Any) -> str:
    return f"{v * 100:.2f}%" if isinstance(v, int | float) and math.isfinite(v) else "–"


def _ms(v: Any) -> str:
    if not isinstance(v, int | float) or not math.isfinite(v):
        return "–"
    return f"{v:,.2f} ms" if abs(v) < 10 else f"{v:,.1f} ms"


def _s(v: Any) -> str:
    return f"{v:,.2f} s" if isinstance(v, int | float) and math.isfinite(v) else "–"


def _points(v: Any) -> str:
    return f"{v * 100:.1f} pts" if isinstance(v, int | float) and math.isfinite(v) else "–"


def _x(v: Any) -> str:
    return f"{v:.3f}x" if isinstance(v, int | float) and math.isfinite(v) else ""


def _pair(v: Sequence[float | None] | None) -> tuple[float, float] | None:
    """An interval with both ends bounded, else None."""
    if v is None or len(v) != 2:
        return None
    lo, hi = v
    return None if lo is None or hi is None else (float(lo), float(hi))


def _value_format(check: CheckDoc) -> tuple[Any, Any]:
    """How this check's reference/candidate values and threshold read (units by group)."""
    group, metric = check.group, str(check.metric or "")
    if group == "latency":
        return _ms, _x
    if group == "errors":
        return _pct, _pct
    if group in FRACTIONS:
        return _pct, _points
    if group in ("startup", "recovery") or metric.endswith("_s"):
        return _s, _s
    if group == "compatibility":
        return (lambda v: "–" if v is None else f"{v:.0f}"), _num
    return _num, _num


def _check_row(c: CheckDoc, scale: tuple[float, float] | None) -> dict[str, Any]:
    value, limit = _value_format(c)
    interval, estimate = _pair(c.interval), _pair(c.estimate_interval)
    glyph = None
    if scale is not None and interval is not None and c.threshold is not None:
        glyph = Markup(interval_glyph(c.ratio, interval, c.threshold, scale, c.decision))
    if c.group == "latency":
        show_interval = f"{interval[0]:.3f}–{interval[1]:.3f}x" if interval else ""
    elif interval and c.group in FRACTIONS:
        show_interval = f"{interval[0] * 100:+.1f} to {interval[1] * 100:+.1f} pts"
    elif interval:
        show_interval = f"{interval[0]:+.3g} to {interval[1]:+.3g}"
    else:
        show_interval = ""
    # a check the document gives no sample counts shows none (not the model's default)
    samples = c.samples if "samples" in c.model_fields_set and len(c.samples) == 2 else None
    return {
        "id": c.id,
        "decision": c.decision,
        "reference": value(c.reference),
        "candidate": value(c.candidate),
        "ratio": _x(c.ratio),
        "interval": show_interval,
        "estimate": f"{estimate[0]:.3f}–{estimate[1]:.3f}x" if estimate else "",
        "threshold": limit(c.threshold) if c.threshold is not None else "–",
        "samples": f"{samples[0]} / {samples[1]}" if samples else "",
        "message": c.message,
        "warning": c.warning or None,
        # an undecided check that does not hold: what the continue could not show
        "not_shown": c.decision == "undecided" and c.required is False and not c.advisory,
        "advisory": c.advisory,
        "glyph": glyph,
    }


def _glyph_scale(checks: Sequence[CheckDoc]) -> tuple[float, float] | None:
    ends: list[float] = []
    for c in checks:
        iv = _pair(c.interval)
        if iv is not None and c.threshold is not None:
            ends += [iv[0], iv[1], c.threshold]
    ends = [e for e in ends if math.isfinite(e)]
    if not ends:
        return None
    lo = max(0.25, min(0.9, min(ends) * 0.97))
    hi = min(4.0, max(1.1, max(ends) * 1.03))
    return lo, hi


def _count(checks: Sequence[CheckDoc]) -> dict[str, int]:
    return {d: sum(1 for c in checks if c.decision == d) for d in ("fail", "undecided", "pass")}


def _groups(checks: Sequence[CheckDoc]) -> list[dict[str, Any]]:
    by: dict[str, list[CheckDoc]] = {}
    for c in checks:
        by.setdefault(c.group or "other", []).append(c)
    order = [g for g in GROUPS if g in by] + [g for g in by if g not in GROUPS]
    out = []
    for g in order:
        rows = by[g]
        scale = _glyph_scale(rows) if g == "latency" else None
        counts = _count(rows)
        out.append(
            {
                "key": g,
                "title": GROUPS.get(g, g.capitalize()),
                "rows": [_check_row(c, scale) for c in rows],
                "counts": counts,
                "open": g in ALWAYS_OPEN or counts["fail"] + counts["undecided"] > 0,
                "glyphs": scale is not None,
            }
        )
    return out


def _headline(doc: VerdictDocument, counts: Mapping[str, int], summary: Summary) -> str:
    """One sentence beside the verdict word. Never "every check passed" unless each did: a
    continue with undecided checks says what it could not show (`summary`)."""
    total = sum(counts.values())
    if doc.error is not None and doc.error.message:
        return "The gate could not finish, so it cannot vouch for the candidate."
    if summary.verdict == "continue":
        warned = f", with {_plural(len(summary.warnings), 'warning')}" if summary.warnings else ""
        if summary.advisory:  # failed, but the policy lets them pass: never "no regression"
            n = _plural(len(summary.advisory), "advisory check")
            warned += f"; {n} failed, listed below, which the policy lets pass"
        blocking = "blocking " if summary.advisory else ""
        if summary.not_shown:
            return (
                f"{counts['pass']} of {total} checks passed and no {blocking}regression was "
                f"shown ({len(summary.not_shown)} undecided, listed below as not shown)"
                f"{warned}: the candidate may keep rolling out."
            )
        if total and counts["pass"] == total:
            return f"All {total} checks passed{warned}: the candidate may keep rolling out."
        return f"Nothing held the gate{warned}: the candidate may keep rolling out."
    parts = []
    if summary.failed:
        parts.append(f"{len(summary.failed)} of {total} checks failed")
    if summary.undecided:
        parts.append(f"{len(summary.undecided)} required could not be decided")
    if parts:
        return "; ".join(parts) + ": the candidate should not keep rolling out."
    return "The candidate should not keep rolling out."


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _quantiles(d: DistributionDoc | None, keys: Sequence[str]) -> str:
    return " / ".join(
        _ms(getattr(d, k) if d is not None else None).removesuffix(" ms") for k in keys
    )


def _summary_rows(sc: ScenarioDoc) -> list[dict[str, str]]:
    rows = []
    for role, s in (("reference", sc.reference), ("candidate", sc.candidate)):
        req = s.requests
        errs = {k: v for k, v in s.errors_by_kind.items() if v}
        rows.append(
            {
                "role": role,
                "requests": f"{req.ok} / {req.sent}" if req is not None else "– / –",
                "ttft": _quantiles(s.ttft_ms, ("p50", "p90", "p99")),
                "itl": _quantiles(s.itl_ms, ("p50", "p90", "p99")),
                "e2e": _quantiles(s.e2e_ms, ("p50", "p99")),
                "tokens": _num(s.throughput.output_tokens_per_s if s.throughput else None, 1),
                "errors": ", ".join(f"{k} {v}" for k, v in errs.items()) or "none",
                # absent from documents of gates before loadgen counted them
                "resent": str(req.resent) if req is not None and req.resent is not None else "–",
            }
        )
    return rows


def _plan_note(doc: VerdictDocument, name: str) -> str | None:
    """What the plan could detect: its note, written before the load."""
    return next(
        (
            n.removeprefix(f"{name}: ")
            for n in doc.notes
            if n.startswith(f"{name}: ") and "planned requests per engine" in n
        ),
        None,
    )


def _scenarios(
    doc: VerdictDocument, columns: Mapping[str, Mapping[str, Columns]], warmup: int
) -> list[dict[str, Any]]:
    out = []
    for i, sc in enumerate(doc.scenarios or []):
        name = sc.name
        phases = _phases_of(sc)
        cols = columns.get(name)
        slos = _slos(sc)
        charts = scenario_charts(name, cols, warmup, phases, slos, sc.duration_s) if cols else {}
        early = sc.early_stop
        # The plan line: what the plan could detect and what the verdict cost, in requests
        # per engine.
        judged = early.requests if early else _judged(sc, warmup)
        rows = _summary_rows(sc)
        out.append(
            {
                "name": name,
                "anchor": f"scenario-{i + 1}",
                "early_stop": (early.message or early.reason) if early else None,
                "stop_label": "ended" if early and early.reason == "planned" else "stopped early",
                "planned": sc.planned_requests,
                "plan_note": _plan_note(doc, name),
                "judged": judged,
                "looks": sc.looks,
                "duration": _seconds(sc.duration_s),
                "aborted": sc.aborted,
                "phases": phases,
                "rows": rows,
                "resent_note": _resent_note(rows),
                "charts": [*charts.values(), *telemetry_charts(name, sc.telemetry, phases)],
                "goodput": goodput_note(slos),
                "warmup": warmup,
                "workload": _workload(sc),
            }
        )
    return out


def _workload(sc: ScenarioDoc) -> dict[str, Any] | None:
    """What a scenario's workload sent, in words and three charts: prompt lengths, output
    lengths and arrivals over time."""
    w = sc.workload
    if w is None:
        return None
    parts = ", ".join(
        f"{p.kind}{' (' + p.file + ')' if p.file else ''}: {p.requests}" for p in w.parts
    )
    words = [f"{w.requests} requests ({parts})"]
    if w.replay:
        words.append(f"a trace replayed at its {w.replay} instants")
    if w.sessions:
        words.append(
            f"{w.sessions} multi-turn sessions, {w.later_turns} later turns sent with each "
            "engine's own earlier answers (the engines' contexts differ after the first turn)"
        )
    lengths = (("prompt tokens", w.prompt_tokens), ("output tokens asked", w.output_tokens))
    for label, d in lengths:
        if d.count:
            words.append(
                f"{label} p50 {_num(d.p50, 0)}, p90 {_num(d.p90, 0)}, max {_num(d.max, 0)}"
            )
    bins = w.arrivals_bin_s
    edges = [round(i * bins, 4) for i in range(len(w.arrivals) + 1)]
    charts = [
        bar_chart(
            w.prompt_tokens.edges,
            w.prompt_tokens.counts,
            f"{sc.name}: prompt tokens per request",
            "prompt tokens (each request's own turn)",
            "requests",
            kind="workload-prompt",
        ),
        bar_chart(
            w.output_tokens.edges,
            w.output_tokens.counts,
            f"{sc.name}: output tokens asked (max_tokens)",
            "max_tokens",
            "requests",
            kind="workload-output",
        ),
        bar_chart(
            edges,
            w.arrivals,
            f"{sc.name}: arrivals over time",
            f"seconds into scenario ({bins:g} s bins)",
            "first turns and requests",
            kind="workload-arrivals",
        ),
    ]
    return {"text": "; ".join(words) + ".", "notes": w.notes, "charts": [Markup(c) for c in charts]}


def _resent_note(rows: Sequence[Mapping[str, str]]) -> str | None:
    """Requests sent twice are said in words, never folded into the errors or hidden."""
    parts = [f"{r['resent']} to the {r['role']}" for r in rows if r["resent"] not in ("0", "–")]
    if not parts:
        return None
    return (
        f"Sent again on a fresh connection: {' and '.join(parts)}. The engine closed a "
        "kept-alive connection as each went out, before answering it; that race is the "
        "client's, so these are not engine errors, and their latency counts from the resend."
    )


def _judged(sc: ScenarioDoc, warmup: int) -> int | None:
    """Requests per engine the scenario's verdict rests on: what both sent, less the warm-up."""
    ref, cand = sc.reference.requests, sc.candidate.requests
    if ref is None or cand is None:
        return None
    return max(min(ref.sent, cand.sent) - warmup, 0)


def _roles(engines: Mapping[Role, EngineDoc]) -> list[Role]:
    return [r for r in ROLES if r in engines] + [r for r in engines if r not in ROLES]


def _placement(p: PlacementDoc | None) -> str | None:
    if p is None:
        return None
    sku = p.sku if p.sku is not None else "?"  # absent from hand-made documents
    return f"{p.node} · {sku} · GPU " + ",".join(str(g) for g in p.gpus)


def _ready(e: EngineDoc) -> str:
    if e.ready_s is not None:
        return _s(e.ready_s)
    return "attached (not launched)" if e.kind == "endpoint" else "never ready"


def _engines(doc: VerdictDocument) -> list[dict[str, Any]]:
    engines = doc.engines or {}
    return [
        {
            "role": role,
            "kind": e.kind,
            "url": e.url or "–",
            "placement": _placement(e.placement),
            "ready": _ready(e),
            "crash": e.crash,
            "log_tail": list(e.log_tail),
            "log": e.log,
            "capabilities": _capabilities(e.capabilities),
            "groups": _engine_groups(e),
            "config": engine_config(doc.scenarios or [], role),
        }
        for role in _roles(engines)
        for e in (engines[role],)
    ]


def _engine_groups(e: EngineDoc) -> list[dict[str, Any]]:
    """An engine of several worker groups: each group's placement and lifecycle, the router's."""
    placed = {g.role: g for g in (e.placement.groups if e.placement else None) or []}
    out = []
    for g in e.groups or []:
        where = placed.get(g.role)
        nodes = " + ".join(
            f"{n.node} GPU " + ",".join(str(x) for x in n.gpus)
            for n in (where.nodes if where is not None else [])
        )
        state = (
            "crashed"
            if g.crashed
            else f"ready at {_s(g.phases['model_listed'])}"
            if "model_listed" in g.phases
            else "never ready"
        )
        out.append({"role": g.role, "where": nodes or "no GPUs", "state": state, "pid": g.pid})
    return out


def _lifecycles(engines: Mapping[Role, EngineDoc]) -> dict[str, Mapping[str, float]]:
    """The timeline's rows: each engine, then each of its groups (`candidate decode`)."""
    out: dict[str, Mapping[str, float]] = {}
    for role, e in engines.items():
        out[role] = {k: v for k, v in e.phases.items() if "." not in k}
        for g in e.groups or []:
            out[f"{role} {g.role}"] = g.phases
    return out


_CAPABILITY_WORDS = (
    ("completions", "completions"),
    ("chat", "chat"),
    ("logprobs", "logprobs"),
    ("prompt_logprobs", "prompt logprobs"),
    ("token_ids", "token ids"),
    ("prompt_token_ids", "prompt token ids"),
    ("stream_usage", "usage in streams"),
)


def _capabilities(caps: CapabilitiesDoc | None) -> list[tuple[str, bool]] | None:
    """(feature, supported) as the engine answered at readiness; None when not learned."""
    if caps is None:
        return None
    out = []
    for key, words in _CAPABILITY_WORDS:
        if key == "logprobs" and caps.top_logprobs_max is not None:
            words = f"logprobs (top {caps.top_logprobs_max})"
        out.append((words, bool(getattr(caps, key))))
    return out


def _divergences(doc: VerdictDocument) -> list[dict[str, Any]]:
    """Divergence examples, each with a token window around the first divergence; the index
    is computed when the document does not give it."""
    out = []
    for ex in doc.divergence_examples or []:
        ref, cand = ex.reference_tokens, ex.candidate_tokens
        index = ex.index
        if index is None or index < 0:
            index = next(
                (i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b),
                min(len(ref), len(cand)),
            )
        start = max(0, index - 24)

        def window(tokens: list[str], index: int = index, start: int = start) -> list[Any]:
            return [
                (t, "div" if i == index else "after" if i > index else "same")
                for i, t in enumerate(tokens[start : index + 12], start=start)
            ]

        out.append(
            {
                "scenario": ex.scenario,
                "prompt": ex.prompt,
                "index": index,
                "margin": f"{ex.margin:.4g}" if ex.margin is not None else None,
                "skipped": start,
                "reference": window(ref),
                "candidate": window(cand),
                "more": max(len(ref), len(cand)) > index + 12,
                "outside_top_k": bool(ex.outside_top_k),
            }
        )
    return out


def _answered(a: Answered) -> str:
    """Each count the document gives: the reference's, the candidate's, the reference's
    under load (absent from documents of older gates)."""
    counts = [(name, getattr(a, name)) for name in type(a).model_fields]
    return ", ".join(
        f"{name.replace('_', ' ')} {v}" for name, v in counts if name in a.model_fields_set
    )


def _correctness(doc: VerdictDocument) -> list[dict[str, Any]]:
    return [
        {
            "name": run.name,
            "probes": run.probes,
            "answered": _answered(run.answered),
            "exact": run.exact_matches,
            "envelope": run.envelope_exact_matches,
            "teacher": run.teacher_forced,
            "failures": [(f.engine, f.message) for f in run.failures],
            "probes_detail": run.probe_divergence,
            "delta_chart": _delta_chart(run.abs_delta_logprob),
        }
        for run in doc.correctness or []
    ]


def _median_bin(hist: Sequence[int]) -> int | None:
    n, seen = sum(hist), 0
    for i, count in enumerate(hist):
        seen += count
        if n and 2 * seen >= n:
            return i
    return None


def _mirrored(doc: VerdictDocument) -> list[dict[str, Any]]:
    """Each load scenario's mirrored outputs, as compared (temperature 0 only)."""
    return [
        {
            "scenario": sc.name,
            "compared": o.compared,
            "exact": o.exact,
            "early": o.early,
            "early_tokens": o.early_tokens,
            "median": _median_bin(o.histogram),
            "basis": "token ids" if o.basis == "token_ids" else "text",
            "examples": o.examples,
        }
        for sc in doc.scenarios or []
        if (o := sc.outputs) is not None
    ]


def _delta_chart(delta: AbsDeltaDoc | None) -> Markup | None:
    """Teacher-forced |delta logprob| per position, the candidate's against the reference's
    own, with the floor and the envelope's reach marked."""
    if delta is None:
        return None
    cand = np.asarray(delta.candidate, dtype=np.float64)
    env = np.asarray(delta.envelope, dtype=np.float64)
    if not cand.size and not env.size:
        return None
    floor = float(delta.floor_nat or 0.0)
    scale = 1.0 + float(delta.envelope_tolerance or 0.0)
    marks = [(f"floor {floor:g}", floor)]
    if env.size and float(np.max(env)) > 0:
        reach = scale * float(np.quantile(env, 0.99)) + floor
        # A guide for the eye: the checks test per-prompt means (Mann-Whitney), not positions.
        marks.append((f"envelope p99 x{scale:g} + floor {reach:.3g} (a guide)", reach))
    return Markup(
        cdf_chart(
            {"reference vs candidate": cand, "reference vs itself": env},
            "Teacher-forced |delta logprob| per position",
            "nat",
            quantiles=(0.5, 0.99),
            verticals=marks,
            what="positions",
        )
    )


def _probes(doc: VerdictDocument) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in doc.probes or []:
        ref, cand = p.reference, p.candidate
        if ref.ok and not cand.ok:
            outcome = "fail"
        elif not ref.ok:
            outcome = "not judged"
        else:
            outcome = "pass"
        out.append(
            {
                "name": p.name,
                "outcome": outcome,
                "sides": [
                    (role, side.status, side.ok, list(side.problems))
                    for role, side in (("reference", ref), ("candidate", cand))
                ],
            }
        )
    rank = {"fail": 0, "not judged": 1}
    out.sort(key=lambda r: rank.get(str(r["outcome"]), 2))
    return out


def report_context(
    document: VerdictDocument,
    columns: Mapping[str, Mapping[str, Columns]],
    warmup: int = 0,
    links: Sequence[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """Everything the report template shows, computed once, from the typed document (the
    inline JSON is its JSON form: what the file beside the report and the API hold)."""
    checks = document.checks
    counts = _count(checks)
    summary = summary_of(document)
    phases = _lifecycles(document.engines or {})
    if links is None:
        # The file report: the verdict document is written beside it.
        beside = document.document
        links = [("verdict document (JSON)", os.path.basename(beside))] if beside else []
    duration = document.duration_s
    return {
        "doc": document,
        # a document that does not say how long the gate took reads "–"; a null is not shown
        "took": _seconds(duration)
        if duration is not None or "duration_s" not in document.model_fields_set
        else None,
        "verdict": document.verdict,
        "banner": summary.banner,
        "with_warnings": summary.with_warnings if summary.verdict == "continue" else "",
        "summary_line": summary.line(),
        "headline": _headline(document, counts, summary),
        "warnings": list(summary.warnings),
        "not_shown": list(summary.not_shown),
        "advisory": list(summary.advisory),
        "counts": counts,
        "error": document.error,
        "reasons": document.reasons,
        "notes": document.notes,
        "groups": _groups(checks),
        "check_ids": {c.id for c in checks},
        "scenarios": _scenarios(document, columns, warmup),
        "capacity": capacity_sections(document),
        "timeline": Markup(timeline_chart(phases, "Engine lifecycle: launch to ready"))
        if any(phases.values())
        else None,
        "engines": _engines(document),
        "testbed": document.testbed,
        "history": document.history,
        "divergences": _divergences(document),
        "correctness": _correctness(document),
        "mirrored": _mirrored(document),
        "probes": _probes(document),
        "links": list(links),
        "doc_json": json.dumps(document.to_json(), indent=2, allow_nan=False, default=str),
    }


def render_body(
    document: VerdictDocument,
    columns: Mapping[str, Mapping[str, Columns]],
    warmup: int = 0,
    links: Sequence[tuple[str, str]] | None = None,
) -> Markup:
    """The report itself (header, verdict, checks, scenarios, engines, documents): the same
    markup in the file and on the served page."""
    ctx = report_context(document, columns, warmup, links)
    return Markup(environment().get_template("_report.html.j2").render(**ctx))


def render_report(
    document: VerdictDocument, columns: Mapping[str, Mapping[str, Columns]], warmup: int = 0
) -> str:
    """The self-contained file: inline CSS and SVG, no script, nothing fetched."""
    body = render_body(document, columns, warmup)
    title = f"{summary_of(document).banner} · {document.name or 'gate'}"
    return environment().get_template("report.html.j2").render(body=body, title=title)


def write_report(
    document: VerdictDocument,
    columns: Mapping[str, Mapping[str, Columns]],
    path: Path,
    warmup: int = 0,
) -> None:
    """The report at `path` and the verdict document's JSON beside it (`.json`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(document, columns, warmup), encoding="utf-8")
    path.with_suffix(".json").write_text(
        json.dumps(document.to_json(), indent=2, allow_nan=False), encoding="utf-8"
    )
