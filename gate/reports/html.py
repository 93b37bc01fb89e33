"""The gate report: one renderer for the self-contained HTML file (`gate run --report-dir`) and
the page `gate serve` shows at /gates/{id}.

`report_context` turns a verdict document and the stored per-request columns into plain view
data (formatted numbers, server-rendered SVG charts); `render_body` renders it with the
`_report.html.j2` template. The file wraps that body in `report.html.j2` (inline CSS, no
script, a CSP that forbids any); the service wraps the same body in its page with a nav bar.
The checks table and the scenario sections are built here; the other sections' view data
beside it (`scenario_charts`, `engine_cards`, `correctness_views`, `capacity`, `telemetry`),
and the value formats they share in `formats`.

Everything an engine produced (log lines, probe problems, model output in divergence
examples, error messages) is text to Jinja2 with autoescape on, so a `<script>` in model
output is shown, never run. Only the charts are markup, and they escape every label.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import BaseLoader, ChoiceLoader, Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from gate.analysis.samples import Columns
from gate.reports.capacity import capacity_sections
from gate.reports.charts import bar_chart, interval_glyph, timeline_chart
from gate.reports.correctness_views import (
    correctness_runs,
    divergences,
    mirrored_outputs,
    probe_rows,
)
from gate.reports.engine_cards import engine_cards, lifecycles
from gate.reports.formats import format_time, ms, num, pct, points, ratio_x, seconds, seconds_fine
from gate.reports.scenario_charts import goodput_note, scenario_charts, slos_of
from gate.reports.telemetry import telemetry_charts
from gate.verdict.document import CheckDoc, DistributionDoc, ScenarioDoc, VerdictDocument
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
    env.filters["num"] = num
    env.filters["ratio"] = lambda v: "" if v is None else f"{v:.3f}x"
    env.filters["when"] = format_time
    env.filters["seconds"] = seconds
    return env


# --------------------------------------------------------------------------- view data


def _phases_of(sc: ScenarioDoc) -> list[tuple[str, float]]:
    return [(p.name, float(p.start_s)) for p in sc.phases]


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
        return ms, ratio_x
    if group == "errors":
        return pct, pct
    if group in FRACTIONS:
        return pct, points
    if group in ("startup", "recovery") or metric.endswith("_s"):
        return seconds_fine, seconds_fine
    if group == "compatibility":
        return (lambda v: "–" if v is None else f"{v:.0f}"), num
    return num, num


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
        "ratio": ratio_x(c.ratio),
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
        ms(getattr(d, k) if d is not None else None).removesuffix(" ms") for k in keys
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
                "tokens": num(s.throughput.output_tokens_per_s if s.throughput else None, 1),
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
        slos = slos_of(sc)
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
                "duration": seconds(sc.duration_s),
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
            words.append(f"{label} p50 {num(d.p50, 0)}, p90 {num(d.p90, 0)}, max {num(d.max, 0)}")
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
    phases = lifecycles(document.engines or {})
    if links is None:
        # The file report: the verdict document is written beside it.
        beside = document.document
        links = [("verdict document (JSON)", os.path.basename(beside))] if beside else []
    duration = document.duration_s
    return {
        "doc": document,
        # a document that does not say how long the gate took reads "–"; a null is not shown
        "took": seconds(duration)
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
        "engines": engine_cards(document),
        "testbed": document.testbed,
        "history": document.history,
        "divergences": divergences(document),
        "correctness": correctness_runs(document),
        "mirrored": mirrored_outputs(document),
        "probes": probe_rows(document),
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
