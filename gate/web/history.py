"""The history pages: `/history` lists the spec identities with finished gates; `/history/ID`
shows one identity's gates over time (gate/service/history.py): the reference's own TTFT and
ITL per scenario (a drifting reference, a noisier host; the gates that flagged it ringed), each
latency check's candidate/reference ratio, the verdicts and the A/A gates' hold rate, then the
gates as a table with what each ran on. Charts are server-rendered SVG
(gate/reports/history_charts.py); the pages carry the site's CSP and run no script."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup

from gate.core.errors import HistoryNotFound
from gate.http.deps import get_ctx
from gate.reports.history_charts import Point, history_chart, verdict_strip
from gate.service import history
from gate.service.schemas import HistoryPage
from gate.verdict.history import FIGURE_METRICS, FIGURE_QUANTILES, HistoryEntry
from gate.web.pages import _denied, _page

router = APIRouter(include_in_schema=False)

PER_PAGE = 50
RATIO_CHECKS = ("ttft.p50", "ttft.p90", "itl.p50", "itl.p90")
METRIC_WORDS = {"ttft_ms": "TTFT", "itl_ms": "ITL"}


@router.get("/history", response_class=HTMLResponse)
def histories_page(request: Request, page: str = "1") -> Response:
    if (denied := _denied(request)) is not None:
        return denied
    number = int(page) if page.isdigit() and 0 < int(page) < 100_000 else 1
    found = history.spec_histories(get_ctx(request).factory, PER_PAGE, (number - 1) * PER_PAGE)
    return _page(
        request,
        "histories.html.j2",
        title="History",
        specs=found.items,
        total=found.total,
        newer=f"/history?page={number - 1}" if number > 1 else None,
        older=f"/history?page={number + 1}" if number * PER_PAGE < found.total else None,
    )


def _scenarios(entries: list[HistoryEntry]) -> list[str]:
    seen: dict[str, None] = {}
    for e in entries:
        for figure in e.reference:
            seen.setdefault(figure.split(".", 1)[0])
    return list(seen)


def reference_charts(entries: list[HistoryEntry]) -> list[str]:
    """Per scenario and metric, the reference's p50 and p99 over the gates (oldest first)."""
    charts = []
    for scenario in _scenarios(entries):
        for metric in FIGURE_METRICS:
            series = {
                q: [
                    Point(i + 1, e.reference[f], e.host or "", f in e.outliers, e.gate_id)
                    for i, e in enumerate(entries)
                    if (f := f"{scenario}.{metric}.{q}") in e.reference
                ]
                for q in FIGURE_QUANTILES
            }
            title = f"Reference {METRIC_WORDS[metric]} in {scenario} (its own, ms)"
            charts.append(history_chart(series, title, "ms", gates=len(entries), kind="reference"))
    return charts


def ratio_charts(entries: list[HistoryEntry]) -> list[str]:
    """Per scenario, the candidate/reference ratio of the latency checks over the gates."""
    charts = []
    for scenario in _scenarios(entries):
        series = {
            check: [
                Point(i + 1, point.ratio, e.host or "", False, e.gate_id)
                for i, e in enumerate(entries)
                if (point := e.checks.get(f"{scenario}.{check}")) and point.ratio is not None
            ]
            for check in RATIO_CHECKS
        }
        title = f"Candidate / reference in {scenario}"
        charts.append(
            history_chart(
                series, title, "ratio", gates=len(entries), reference_line=1.0, kind="ratios"
            )
        )
    return charts


@router.get("/history/{identity}", response_class=HTMLResponse)
def history_page(request: Request, identity: str, before: str = "") -> Response:
    if (denied := _denied(request)) is not None:
        return denied
    try:
        cursor = datetime.fromisoformat(before.replace("Z", "+00:00")) if before else None
    except ValueError:
        cursor = None
    try:
        found = history.spec_history(get_ctx(request).factory, identity[:16], PER_PAGE, cursor)
    except HistoryNotFound as exc:
        return _page(request, "error.html.j2", 404, title="No such history", message=str(exc))
    return _page(request, "history.html.j2", title=f"History of {found.name}", **_view(found))


def _view(found: HistoryPage) -> dict[str, Any]:
    oldest_first = list(reversed(found.entries))
    older = None
    if found.next_before is not None:
        older = f"/history/{found.identity}?" + urlencode({"before": found.next_before})
    return {
        "h": found,
        "hosts": sorted({e.host or "?" for e in found.entries}),
        "verdicts": Markup(
            verdict_strip(
                [(e.verdict, e.aa, e.gate_id) for e in oldest_first], "Verdicts, oldest to newest"
            )
        ),
        "reference_charts": [Markup(c) for c in reference_charts(oldest_first)],
        "ratio_charts": [Markup(c) for c in ratio_charts(oldest_first)],
        "flagged": sum(1 for e in found.entries if e.outliers),
        "older": older,
    }
