"""A gate as its spec's history keeps it (`HistoryEntry`, the `gates.history` column), the
reference's own figures a run is compared by, and that comparison in the document's words.
Pure: documents in, models out."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from gate.analysis.history import ReferenceComparison
from gate.core.vocabulary import CheckDecision, GateDecision
from gate.verdict.document import (
    DistributionDoc,
    HistoryComparisonDoc,
    ReferenceOutlierDoc,
    ScenarioDoc,
    VerdictDocument,
)
from gate.verdict.document_base import _Doc

FIGURE_METRICS = ("ttft_ms", "itl_ms")
FIGURE_QUANTILES = ("p50", "p99")
MAX_OUTLIERS_NAMED = 3


class CheckPoint(_Doc):
    """One check of one gate: its ratio (ratio checks) and its decision."""

    ratio: float | None = None
    decision: CheckDecision


class HistoryEntry(_Doc):
    """One finished gate in its spec's history: the reference's own figures, every check's
    ratio and decision, the verdict, and what it ran on."""

    gate_id: str
    finished_at: str | None = None
    state: str
    verdict: GateDecision
    aa: bool = False
    host: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    images: dict[str, str | None] = Field(default_factory=dict)
    reference: dict[str, float] = Field(
        default_factory=dict, description="SCENARIO.METRIC.QUANTILE -> ms, the reference's own"
    )
    checks: dict[str, CheckPoint] = Field(default_factory=dict)
    outliers: list[str] = Field(default_factory=list, description="figures flagged in this run")


def reference_figures(scenarios: Sequence[ScenarioDoc]) -> dict[str, float]:
    """The reference's TTFT and ITL p50 and p99 per load scenario, in ms."""
    out: dict[str, float] = {}
    for sc in scenarios:
        for metric in FIGURE_METRICS:
            dist: DistributionDoc | None = getattr(sc.reference, metric)
            for q in FIGURE_QUANTILES:
                value = getattr(dist, q) if dist is not None else None
                if value is not None:
                    out[f"{sc.name}.{metric}.{q}"] = float(value)
    return out


def history_entry(doc: VerdictDocument) -> HistoryEntry:
    assert doc.gate_id is not None
    bed = doc.testbed
    engines = bed.engines if bed is not None else {}
    return HistoryEntry(
        gate_id=doc.gate_id,
        finished_at=doc.finished_at,
        state=doc.state,
        verdict=doc.verdict,
        aa=bool(bed and bed.aa),
        host=bed.host if bed is not None else None,
        versions={role: e.version for role, e in engines.items()},
        images={role: e.image_digest or e.image for role, e in engines.items()},
        reference=reference_figures(doc.scenarios or []) if doc.state == "complete" else {},
        checks={c.id: CheckPoint(ratio=c.ratio, decision=c.decision) for c in doc.checks},
        outliers=[o.figure for o in doc.history.outliers] if doc.history is not None else [],
    )


def comparison_doc(cmp: ReferenceComparison) -> HistoryComparisonDoc:
    """The comparison as the document keeps it, with the note a person reads."""
    outliers = [
        ReferenceOutlierDoc(
            figure=o.figure,
            value=round(o.value, 3),
            median=round(o.median, 3),
            mad=round(o.mad, 3),
            score=round(o.score, 2),
        )
        for o in cmp.outliers
    ]
    return HistoryComparisonDoc(
        gates=cmp.gates, figures=cmp.figures, outliers=outliers, note=comparison_note(cmp)
    )


def comparison_note(cmp: ReferenceComparison) -> str | None:
    if not cmp.enough or not cmp.outliers:
        return None
    named = ", ".join(
        f"{o.figure} {o.value:.1f} ms (median {o.median:.1f}, score {o.score:+.1f})"
        for o in cmp.outliers[:MAX_OUTLIERS_NAMED]
    )
    more = len(cmp.outliers) - MAX_OUTLIERS_NAMED
    return (
        f"The reference is an outlier against the last {cmp.gates} gates of this spec: "
        f"{named}{f' and {more} more' if more > 0 else ''}. The test bed changed, not the "
        "software? Compare the host, GPUs and versions in the history; the candidate is still "
        "judged against this run's reference, which ran beside it."
    )
