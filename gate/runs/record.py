"""The last stage of a run: the verdict document from what the stages handed on, the report
beside it, and the gate's stored record (document, checks, request columns)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gate.analysis.history import HISTORY_WINDOW, compare_reference
from gate.analysis.types import Verdict
from gate.core.errors import GateError
from gate.core.vocabulary import ROLES, FinishedState
from gate.reports.html import write_report
from gate.runs import rows
from gate.runs.context import RunContext
from gate.runs.correctness_divergence import divergence_examples
from gate.runs.engine_pair import Engines
from gate.runs.journal import persist_sync
from gate.runs.probes import CorrectnessResult
from gate.runs.scenarios import ScenarioResult
from gate.spec.identity import spec_identity
from gate.verdict.build import Evidence, Header, gate_document
from gate.verdict.document import (
    CapacityDoc,
    HistoryComparisonDoc,
    ProbeDoc,
    ReservationBlocked,
    ReservationReleased,
    ScenarioDoc,
    VerdictDocument,
)
from gate.verdict.history import comparison_doc, reference_figures


@dataclass
class Observed:
    """What the stages of a run handed on, whatever stopped it."""

    engines: Engines | None = None
    reservation: ReservationReleased | ReservationBlocked | None = None
    scenarios: list[ScenarioResult] = field(default_factory=list)
    capacity: list[CapacityDoc] = field(default_factory=list)
    probes: list[ProbeDoc] = field(default_factory=list)
    correctness: list[CorrectnessResult] = field(default_factory=list)


def compare_with_history(ctx: RunContext, scenarios: list[ScenarioDoc]) -> HistoryComparisonDoc:
    """This run's reference figures against the last gates of its spec identity
    (analysis/history.py); a history that cannot be read is a note, never a failed gate."""
    past = rows.reference_history(ctx.factory, spec_identity(ctx.spec), ctx.gate_id, HISTORY_WINDOW)
    if past is None:
        return HistoryComparisonDoc(gates=0, note="the history could not be read (database)")
    return comparison_doc(compare_reference(reference_figures(scenarios), past))


def evidence(ctx: RunContext, seen: Observed) -> Evidence:
    policy = ctx.spec.policy
    early = [r.early_stop.message for r in seen.scenarios if r.early_stop is not None]
    scenarios = [r.describe() for r in seen.scenarios]
    judged = any(s.reference.ttft_ms is not None for s in scenarios)
    return Evidence(
        engines=seen.engines.describe() if seen.engines is not None else {},
        reservation=seen.reservation,
        scenarios=scenarios,
        capacity=seen.capacity,
        probes=seen.probes,
        correctness=[c.describe() for c in seen.correctness],
        divergence_examples=[
            ex for c in seen.correctness for ex in divergence_examples(c.run, policy)
        ],
        notes=[*early, *ctx.notes],
        testbed=(seen.engines or Engines(ctx, None)).testbed(),
        history=compare_with_history(ctx, scenarios) if judged else None,
    )


def finish(
    ctx: RunContext,
    seen: Observed,
    outcome: tuple[Verdict | None, GateError | None, FinishedState],
    *,
    started: datetime,
    report_dir: Path | None,
) -> VerdictDocument:
    """Build the document, write the report and its JSON beside it, store the record."""
    verdict, error, state = outcome
    finished = datetime.now(UTC)
    report_dir = report_dir or (ctx.settings.data_dir / "reports")
    report_dir.mkdir(parents=True, exist_ok=True)
    report = (report_dir / f"{ctx.spec.name}-{ctx.gate_id[:8]}.html").resolve()
    header = Header(
        gate_id=ctx.gate_id,
        name=ctx.spec.name,
        model=ctx.spec.model,
        report=str(report),
        document=str(report.with_suffix(".json")),
        started_at=started,
        finished_at=finished,
        duration_s=ctx.clock.now_s(),
    )
    doc = gate_document(header, state, verdict, error, evidence(ctx, seen))
    columns = {r.name: r.columns for r in seen.scenarios}
    write_report(doc, columns, report, warmup=ctx.spec.policy.warmup_requests)
    samples = [(r.name, role, r.columns[role]) for r in seen.scenarios for role in ROLES]
    checks = verdict.checks if verdict is not None else ()
    budget = ctx.settings.state_write_retry_s
    ctx.journal.flush(budget)  # every phase row before the record that ends the gate
    ctx.journal.close()
    return persist_sync(
        "the finished gate",
        lambda: rows.finish_run(ctx.factory, doc, checks, samples, finished=finished),
        budget,
        ctx.gate_id,
    )
