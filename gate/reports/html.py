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
from gate.reports.charts import (
    COLORS,
    MUTED,
    Array,
    Line,
    cdf_chart,
    error_timeline,
    interval_glyph,
    line_chart,
    scatter_chart,
    timeline_chart,
)
from gate.verdict.document import VerdictDocument
from gate.verdict.summary import Summary, summary_of

ROLES = ("reference", "candidate")
GROUPS = {
    "latency": "Latency",
    "errors": "Errors",
    "peak": "Peak load: goodput",
    "overload": "Overload: shedding or collapse",
    "recovery": "Recovery after overload",
    "correctness": "Correctness",
    "startup": "Startup",
    "crash": "Crashes",
    "compatibility": "Compatibility",
}
# Groups shown open even when every check passed: what people look at first.
ALWAYS_OPEN = ("latency", "errors", "peak", "overload", "recovery", "correctness")
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


def _phases_of(sc: Mapping[str, Any]) -> list[tuple[str, float]]:
    out = []
    for p in sc.get("phases") or []:
        if isinstance(p, Mapping) and isinstance(p.get("start_s"), int | float):
            out.append((str(p.get("name", "")), float(p["start_s"])))
    return out


def _slos(sc: Mapping[str, Any]) -> dict[str, float]:
    """The scenario's SLOs (ttft_ms, itl_ms, e2e_ms) when the document names any."""
    for found in (
        sc.get("slos"),
        sc.get("slo"),
        *((sc.get(role) or {}).get("goodput", {}).get("slos") for role in ROLES),
    ):
        if isinstance(found, Mapping) and found:
            return {
                k: float(v)
                for k, v in found.items()
                if k in ("ttft_ms", "itl_ms", "e2e_ms") and isinstance(v, int | float)
            }
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
    ttft_time, itl_time = {}, {}
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
    # Throughput, goodput and errors describe everything that was sent, warm-up included.
    end_s = max(
        [duration_s or 0.0]
        + [float(c.end_ns.max()) / 1e9 for c in columns.values() if len(c) and c.end_ns.max() > 0]
        + [float(c.sent_ns.max()) / 1e9 for c in columns.values() if len(c)]
    )
    width = _bucket_width(end_s or 1.0)
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
    errors = {}
    for role, c in columns.items():
        bad = c.error >= 0
        kinds = [ERROR_KINDS[int(k)] if 0 <= k < len(ERROR_KINDS) else "?" for k in c.error[bad]]
        errors[role] = ((c.sent_ns[bad] / 1e9).astype(np.float64), kinds)
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
        "errors": Markup(error_timeline(errors, end_s, f"{name}: failed requests", phases)),
    }


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


def _pair(v: Any) -> tuple[float, float] | None:
    if isinstance(v, list | tuple) and len(v) == 2 and all(isinstance(x, int | float) for x in v):
        return float(v[0]), float(v[1])
    return None


def _value_format(check: Mapping[str, Any]) -> tuple[Any, Any]:
    """How this check's reference/candidate values and threshold read (units by group)."""
    group, metric = check.get("group"), str(check.get("metric", ""))
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


def _check_row(c: Mapping[str, Any], scale: tuple[float, float] | None) -> dict[str, Any]:
    value, limit = _value_format(c)
    interval, estimate = _pair(c.get("interval")), _pair(c.get("estimate_interval"))
    ratio = c.get("ratio") if isinstance(c.get("ratio"), int | float) else None
    threshold = c.get("threshold")
    glyph = None
    if scale is not None and interval is not None and isinstance(threshold, int | float):
        glyph = Markup(
            interval_glyph(ratio, interval, float(threshold), scale, str(c.get("decision")))
        )
    if c.get("group") == "latency":
        show_interval = f"{interval[0]:.3f}–{interval[1]:.3f}x" if interval else ""
    elif interval and c.get("group") in FRACTIONS:
        show_interval = f"{interval[0] * 100:+.1f} to {interval[1] * 100:+.1f} pts"
    elif interval:
        show_interval = f"{interval[0]:+.3g} to {interval[1]:+.3g}"
    else:
        show_interval = ""
    samples = c.get("samples")
    return {
        "id": str(c.get("id", "")),
        "decision": str(c.get("decision", "")),
        "reference": value(c.get("reference")),
        "candidate": value(c.get("candidate")),
        "ratio": _x(ratio),
        "interval": show_interval,
        "estimate": f"{estimate[0]:.3f}–{estimate[1]:.3f}x" if estimate else "",
        "threshold": limit(threshold) if threshold is not None else "–",
        "samples": f"{samples[0]} / {samples[1]}"
        if isinstance(samples, list | tuple) and len(samples) == 2
        else "",
        "message": str(c.get("message", "")),
        "warning": str(c["warning"]) if c.get("warning") else None,
        # an undecided check that does not hold: what the continue could not show
        "not_shown": c.get("decision") == "undecided" and c.get("required") is False,
        "glyph": glyph,
    }


def _glyph_scale(checks: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    ends: list[float] = []
    for c in checks:
        iv = _pair(c.get("interval"))
        if iv is not None and isinstance(c.get("threshold"), int | float):
            ends += [iv[0], iv[1], float(c["threshold"])]
    ends = [e for e in ends if math.isfinite(e)]
    if not ends:
        return None
    lo = max(0.25, min(0.9, min(ends) * 0.97))
    hi = min(4.0, max(1.1, max(ends) * 1.03))
    return lo, hi


def _count(checks: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {
        d: sum(1 for c in checks if c.get("decision") == d) for d in ("fail", "undecided", "pass")
    }


def _groups(checks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, list[Mapping[str, Any]]] = {}
    for c in checks:
        by.setdefault(str(c.get("group", "other")), []).append(c)
    order = [g for g in GROUPS if g in by] + [g for g in by if g not in GROUPS]
    out = []
    for g in order:
        rows = by[g]
        scale = _glyph_scale(rows) if g == "latency" else None
        counts = {
            d: sum(1 for c in rows if c.get("decision") == d) for d in ("fail", "undecided", "pass")
        }
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


def _headline(doc: Mapping[str, Any], counts: Mapping[str, int], summary: Summary) -> str:
    """One sentence beside the verdict word. Never "every check passed" unless each did: a
    continue with undecided checks says what it could not show (`summary`)."""
    total = sum(counts.values())
    err = doc.get("error")
    if isinstance(err, Mapping) and err.get("message"):
        return "The gate could not finish, so it cannot vouch for the candidate."
    if summary.verdict == "continue":
        warned = f", with {_plural(len(summary.warnings), 'warning')}" if summary.warnings else ""
        if summary.not_shown:
            return (
                f"{counts['pass']} of {total} checks passed and no regression was shown "
                f"({len(summary.not_shown)} undecided, listed below as not shown){warned}: the "
                "candidate may keep rolling out."
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


def _summary_rows(sc: Mapping[str, Any]) -> list[dict[str, str]]:
    rows = []
    for role in ROLES:
        s = sc.get(role)
        if not isinstance(s, Mapping):
            continue

        def q(metric: str, keys: Sequence[str], s: Mapping[str, Any] = s) -> str:
            d = s.get(metric) or {}
            return " / ".join(_ms(d.get(k)).removesuffix(" ms") for k in keys)

        req = s.get("requests") or {}
        errs = {k: v for k, v in (s.get("errors_by_kind") or {}).items() if v}
        rows.append(
            {
                "role": role,
                "requests": f"{req.get('ok', '–')} / {req.get('sent', '–')}",
                "ttft": q("ttft_ms", ("p50", "p90", "p99")),
                "itl": q("itl_ms", ("p50", "p90", "p99")),
                "e2e": q("e2e_ms", ("p50", "p99")),
                "tokens": _num((s.get("throughput") or {}).get("output_tokens_per_s"), 1),
                "errors": ", ".join(f"{k} {v}" for k, v in errs.items()) or "none",
                # absent from documents of gates before loadgen counted them
                "resent": str(req["resent"]) if isinstance(req.get("resent"), int) else "–",
            }
        )
    return rows


def _scenarios(
    doc: Mapping[str, Any], columns: Mapping[str, Mapping[str, Columns]], warmup: int
) -> list[dict[str, Any]]:
    out = []
    for i, sc in enumerate(doc.get("scenarios") or []):
        if not isinstance(sc, Mapping):
            continue
        name = str(sc.get("name", f"scenario {i + 1}"))
        phases = _phases_of(sc)
        cols = columns.get(name)
        slos = _slos(sc)
        charts = (
            scenario_charts(name, cols, warmup, phases, slos, sc.get("duration_s")) if cols else {}
        )
        early = sc.get("early_stop") if isinstance(sc.get("early_stop"), Mapping) else None
        # The plan line: what the plan could detect (its note, written before the load) and
        # what the verdict cost, in requests per engine.
        plan_note = next(
            (
                str(n).removeprefix(f"{name}: ")
                for n in doc.get("notes") or []
                if str(n).startswith(f"{name}: ") and "planned requests per engine" in str(n)
            ),
            None,
        )
        judged = early.get("requests") if early else _judged(sc, warmup)
        rows = _summary_rows(sc)
        out.append(
            {
                "name": name,
                "anchor": f"scenario-{i + 1}",
                "early_stop": str(early.get("message") or early.get("reason") or "")
                if early
                else None,
                "stop_label": "ended"
                if early and early.get("reason") == "planned"
                else "stopped early",
                "planned": sc.get("planned_requests"),
                "plan_note": plan_note,
                "judged": judged,
                "looks": sc.get("looks"),
                "duration": _seconds(sc.get("duration_s")),
                "aborted": bool(sc.get("aborted")),
                "phases": phases,
                "rows": rows,
                "resent_note": _resent_note(rows),
                "charts": list(charts.values()),
                "goodput": goodput_note(slos),
                "warmup": warmup,
            }
        )
    return out


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


def _judged(sc: Mapping[str, Any], warmup: int) -> int | None:
    """Requests per engine the scenario's verdict rests on: what both sent, less the warm-up."""
    sent = []
    for role in ROLES:
        side = sc.get(role)
        req = side.get("requests") if isinstance(side, Mapping) else None
        if isinstance(req, Mapping) and isinstance(req.get("sent"), int):
            sent.append(int(req["sent"]))
    return max(min(sent) - warmup, 0) if len(sent) == len(ROLES) else None


def _engines(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    engines = doc.get("engines") or {}
    for role in [r for r in ROLES if r in engines] + [r for r in engines if r not in ROLES]:
        e = engines[role] or {}
        p = e.get("placement") or {}
        crash = e.get("crash") if isinstance(e.get("crash"), Mapping) else None
        out.append(
            {
                "role": role,
                "kind": e.get("kind", "–"),
                "url": e.get("url") or "–",
                "placement": (
                    f"{p.get('node', '?')} · {p.get('sku', '?')} · GPU "
                    + ",".join(str(g) for g in p.get("gpus") or [])
                )
                if p
                else None,
                "ready": _s(e.get("ready_s"))
                if e.get("ready_s") is not None
                else "attached (not launched)"
                if e.get("kind") == "endpoint"
                else "never ready",
                "crash": crash,
                "log_tail": [str(x) for x in e.get("log_tail") or []],
                "log": e.get("log"),
                "capabilities": _capabilities(e.get("capabilities")),
                "groups": _engine_groups(e),
            }
        )
    return out


def _engine_groups(e: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An engine of several worker groups: each group's placement and lifecycle, the router's."""
    placed = {
        str(g.get("role")): g
        for g in (e.get("placement") or {}).get("groups") or []
        if isinstance(g, Mapping)
    }
    out = []
    for g in e.get("groups") or []:
        if not isinstance(g, Mapping):
            continue
        role = str(g.get("role"))
        where = placed.get(role) or {}
        nodes = " + ".join(
            f"{n.get('node', '?')} GPU " + ",".join(str(x) for x in n.get("gpus") or [])
            for n in where.get("nodes") or []
            if isinstance(n, Mapping)
        )
        phases = g.get("phases") or {}
        state = (
            "crashed"
            if g.get("crashed")
            else f"ready at {_s(phases['model_listed'])}"
            if "model_listed" in phases
            else "never ready"
        )
        out.append({"role": role, "where": nodes or "no GPUs", "state": state, "pid": g.get("pid")})
    return out


def _lifecycles(engines: Mapping[str, Any]) -> dict[str, Mapping[str, float]]:
    """The timeline's rows: each engine, then each of its groups (`candidate decode`)."""
    out: dict[str, Mapping[str, float]] = {}
    for role, e in engines.items():
        if not isinstance(e, Mapping):
            continue
        out[role] = {k: v for k, v in (e.get("phases") or {}).items() if "." not in k}
        for g in e.get("groups") or []:
            if isinstance(g, Mapping):
                out[f"{role} {g.get('role')}"] = g.get("phases") or {}
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


def _capabilities(caps: Any) -> list[tuple[str, bool]] | None:
    """(feature, supported) as the engine answered at readiness; None when not learned."""
    if not isinstance(caps, Mapping):
        return None
    out = []
    for key, words in _CAPABILITY_WORDS:
        if key == "logprobs" and isinstance(caps.get("top_logprobs_max"), int):
            words = f"logprobs (top {caps['top_logprobs_max']})"
        out.append((words, bool(caps.get(key))))
    return out


def _tokens(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, Sequence):
        return [str(t) for t in v]
    return []


def _divergences(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Divergence examples (top level, or per scenario), each with a token window around the
    first divergence; the index is computed when the document does not give it."""
    found: list[tuple[str | None, Mapping[str, Any]]] = [
        (None, ex) for ex in doc.get("divergence_examples") or [] if isinstance(ex, Mapping)
    ]
    for sc in doc.get("scenarios") or []:
        if isinstance(sc, Mapping):
            found += [
                (str(sc.get("name")), ex)
                for ex in sc.get("divergence_examples") or []
                if isinstance(ex, Mapping)
            ]
    out = []
    for scenario, ex in found:
        ref, cand = _tokens(ex.get("reference_tokens")), _tokens(ex.get("candidate_tokens"))
        index = ex.get("index")
        if not isinstance(index, int) or index < 0:
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

        margin = ex.get("margin")
        prompt = ex.get("prompt")
        if isinstance(prompt, list):  # chat messages
            prompt = "\n".join(
                f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, Mapping) else str(m)
                for m in prompt
            )
        out.append(
            {
                "scenario": scenario or ex.get("scenario"),
                "prompt": "" if prompt is None else str(prompt),
                "index": index,
                "margin": f"{margin:.4g}" if isinstance(margin, int | float) else None,
                "skipped": start,
                "reference": window(ref),
                "candidate": window(cand),
                "more": max(len(ref), len(cand)) > index + 12,
                "outside_top_k": bool(ex.get("outside_top_k")),
            }
        )
    return out


def _correctness(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for run in doc.get("correctness") or []:
        if not isinstance(run, Mapping):
            continue
        answered: Mapping[str, Any] = run.get("answered") or {}
        if not isinstance(answered, Mapping):
            answered = {}
        out.append(
            {
                "name": str(run.get("name", "")),
                "probes": run.get("probes"),
                "answered": ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in answered.items()),
                "exact": run.get("exact_matches"),
                "envelope": run.get("envelope_exact_matches"),
                "teacher": run.get("teacher_forced"),
                "failures": [
                    (str(f.get("engine", "")), str(f.get("message", "")))
                    for f in run.get("failures") or []
                    if isinstance(f, Mapping)
                ],
                "probes_detail": [
                    p for p in run.get("probe_divergence") or [] if isinstance(p, Mapping)
                ],
                "delta_chart": _delta_chart(run.get("abs_delta_logprob")),
            }
        )
    return out


def _mirrored(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each load scenario's mirrored outputs, as compared (temperature 0 only)."""
    out = []
    for sc in doc.get("scenarios") or []:
        o = sc.get("outputs") if isinstance(sc, Mapping) else None
        if not isinstance(o, Mapping):
            continue
        hist = [int(x) for x in o.get("histogram") or []]
        n, seen, median = sum(hist), 0, None
        for i, count in enumerate(hist):
            seen += count
            if n and 2 * seen >= n:
                median = i
                break
        out.append(
            {
                "scenario": str(sc.get("name", "")),
                "compared": o.get("compared"),
                "exact": o.get("exact"),
                "early": o.get("early"),
                "early_tokens": o.get("early_tokens"),
                "median": median,
                "basis": "token ids" if o.get("basis") == "token_ids" else "text",
                "examples": [e for e in o.get("examples") or [] if isinstance(e, Mapping)],
            }
        )
    return out


def _delta_chart(delta: Any) -> Markup | None:
    """Teacher-forced |delta logprob| per position, the candidate's against the reference's
    own, with the floor and the envelope's reach marked."""
    if not isinstance(delta, Mapping):
        return None
    cand = np.asarray(delta.get("candidate") or [], dtype=np.float64)
    env = np.asarray(delta.get("envelope") or [], dtype=np.float64)
    if not cand.size and not env.size:
        return None
    floor = float(delta.get("floor_nat") or 0.0)
    scale = 1.0 + float(delta.get("envelope_tolerance") or 0.0)
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


def _probes(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in doc.get("probes") or []:
        if not isinstance(p, Mapping):
            continue
        ref, cand = p.get("reference") or {}, p.get("candidate") or {}
        if ref.get("ok") and not cand.get("ok"):
            outcome = "fail"
        elif not ref.get("ok"):
            outcome = "not judged"
        else:
            outcome = "pass"
        out.append(
            {
                "name": str(p.get("name", "")),
                "outcome": outcome,
                "sides": [
                    (
                        role,
                        side.get("status"),
                        bool(side.get("ok")),
                        [str(x) for x in side.get("problems") or []],
                    )
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
    """Everything the report template shows, computed once, from the document's JSON form
    (what the file beside the report and the API hold, so the page shows what they say)."""
    doc = document.to_json()
    checks = [c for c in doc.get("checks") or [] if isinstance(c, Mapping)]
    counts = {
        d: sum(1 for c in checks if c.get("decision") == d) for d in ("fail", "undecided", "pass")
    }
    summary = summary_of(document)
    engines = doc.get("engines") or {}
    phases = _lifecycles(engines)
    if links is None:
        # The file report: the verdict document is written beside it.
        beside = doc.get("document")
        links = [("verdict document (JSON)", os.path.basename(str(beside)))] if beside else []
    err = doc.get("error") if isinstance(doc.get("error"), Mapping) else None
    return {
        "doc": doc,
        "verdict": str(doc.get("verdict") or "hold"),
        "banner": summary.banner,
        "with_warnings": summary.with_warnings if summary.verdict == "continue" else "",
        "summary_line": summary.line(),
        "headline": _headline(doc, counts, summary),
        "warnings": list(summary.warnings),
        "not_shown": list(summary.not_shown),
        "counts": counts,
        "error": err,
        "reasons": [r for r in doc.get("reasons") or [] if isinstance(r, Mapping)],
        "notes": [str(n) for n in doc.get("notes") or []],
        "groups": _groups(checks),
        "check_ids": {str(c.get("id")) for c in checks},
        "scenarios": _scenarios(doc, columns, warmup),
        "timeline": Markup(timeline_chart(phases, "Engine lifecycle: launch to ready"))
        if any(phases.values())
        else None,
        "engines": _engines(doc),
        "divergences": _divergences(doc),
        "correctness": _correctness(doc),
        "mirrored": _mirrored(doc),
        "probes": _probes(doc),
        "links": list(links),
        "doc_json": json.dumps(doc, indent=2, allow_nan=False, default=str),
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
