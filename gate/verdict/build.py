"""The ways a verdict document comes to be: a gate that judged, a gate that stopped before it
could (an error, a cancel, the reaper), and a spec refused before any gate began. Pure: the
runner hands in what it observed, typed; nothing here reads a clock or a database."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gate.analysis.types import Check, Verdict
from gate.core.clock import utc_text
from gate.core.errors import GateError, SpecError
from gate.core.vocabulary import (
    EXIT_CONTINUE,
    EXIT_ERROR,
    EXIT_HOLD,
    EXIT_INTERRUPTED,
    FinishedState,
    Role,
)
from gate.verdict.document import (
    CapacityDoc,
    CheckDoc,
    CorrectnessDoc,
    DivergenceExample,
    EngineDoc,
    ErrorDoc,
    HistoryComparisonDoc,
    PlatformDoc,
    ProbeDoc,
    ReasonDoc,
    ReservationBlocked,
    ReservationReleased,
    ScenarioDoc,
    VerdictDocument,
)
from gate.verdict.summary import summarize

UNFINISHED_NOTE = "The gate could not finish, so it cannot vouch for the candidate: hold."
MAX_DIVERGENCE_EXAMPLES = 5


def check_doc(check: Check) -> CheckDoc:
    """A judged check as the document shows it (non-finite numbers read as null)."""
    return CheckDoc.model_validate(check.to_dict())


def exit_code(state: FinishedState, verdict: Verdict | None) -> int:
    if verdict is not None:
        return EXIT_CONTINUE if verdict.decision == "continue" else EXIT_HOLD
    return EXIT_INTERRUPTED if state == "cancelled" else EXIT_ERROR


@dataclass
class Evidence:
    """What a gate observed, whatever it decided: the parts of the document the runner fills."""

    engines: dict[Role, EngineDoc]
    reservation: ReservationReleased | ReservationBlocked | None = None
    scenarios: list[ScenarioDoc] = field(default_factory=list)
    capacity: list[CapacityDoc] = field(default_factory=list)
    probes: list[ProbeDoc] = field(default_factory=list)
    correctness: list[CorrectnessDoc] = field(default_factory=list)
    divergence_examples: list[DivergenceExample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the run's own, after the judge's
    testbed: PlatformDoc | None = None
    history: HistoryComparisonDoc | None = None  # this run's reference against its history


@dataclass(frozen=True)
class Header:
    """Which gate, and when."""

    gate_id: str
    name: str
    model: str
    report: str
    document: str
    started_at: datetime
    finished_at: datetime
    duration_s: float


def gate_document(
    header: Header,
    state: FinishedState,
    verdict: Verdict | None,
    error: GateError | None,
    evidence: Evidence,
) -> VerdictDocument:
    """The document of a gate that ran: judged (`verdict`), or stopped by `error`."""
    if verdict is not None:
        reasons = [ReasonDoc(check=c.id, message=c.message) for c in verdict.reasons]
        checks = [check_doc(c) for c in verdict.checks]
        notes = [*verdict.notes, *evidence.notes]
        if evidence.history is not None and evidence.history.note:
            notes.append(evidence.history.note)
    else:
        assert error is not None, "a gate without a verdict ended with an error"
        reasons = [ReasonDoc(check=f"gate.{error.code}", message=error.message)]
        checks, notes = [], [UNFINISHED_NOTE]
    decision = verdict.decision if verdict is not None else "hold"
    summary = summarize(decision, checks, reasons)
    return VerdictDocument(
        gate_id=header.gate_id,
        name=header.name,
        model=header.model,
        state=state,
        verdict=decision,
        summary=summary.line(),
        reasons=reasons,
        warnings=list(summary.warnings),
        not_shown=list(summary.not_shown),
        advisory=list(summary.advisory),
        checks=checks,
        notes=notes,
        report=header.report,
        document=header.document,
        error=ErrorDoc(code=error.code, message=error.message) if error else None,
        engines=evidence.engines,
        reservation=evidence.reservation,
        scenarios=evidence.scenarios,
        capacity=evidence.capacity or None,
        probes=evidence.probes,
        correctness=evidence.correctness,
        divergence_examples=evidence.divergence_examples[:MAX_DIVERGENCE_EXAMPLES],
        started_at=utc_text(header.started_at),
        finished_at=utc_text(header.finished_at),
        duration_s=round(header.duration_s, 3),
        exit_code=exit_code(state, verdict),
        testbed=evidence.testbed,
        history=evidence.history,
    )


def ended_document(
    gate_id: str,
    name: str | None,
    state: FinishedState,
    check: str,
    message: str,
    finished_at: datetime,
) -> VerdictDocument:
    """The document of a gate ended from outside its run (the reaper, a cancel while pending,
    a worker that failed it): a hold naming why, with nothing observed."""
    reasons = [ReasonDoc(check=check, message=message)]
    return VerdictDocument(
        gate_id=gate_id,
        name=name,
        state=state,
        verdict="hold",
        summary=summarize("hold", [], reasons).line(),
        reasons=reasons,
        checks=[],
        notes=[UNFINISHED_NOTE],
        error=ErrorDoc(code=check.removeprefix("gate."), message=message),
        finished_at=utc_text(finished_at),
        exit_code=exit_code(state, None),
    )


def invalid_spec_document(exc: SpecError) -> VerdictDocument:
    """`gate run --json` on a spec it refused: a hold that names every mistake."""
    reasons = [ReasonDoc(check=f"spec.{p.path}", message=p.message) for p in exc.problems]
    return VerdictDocument(
        state="invalid",
        verdict="hold",
        # "spec has 3 mistakes", the reasons name each
        summary=summarize("hold", [], [ReasonDoc(check="spec", message=exc.message)]).line(),
        reasons=reasons,
        checks=[],
        notes=[],
        report=None,
        error=ErrorDoc(code=exc.code, message=exc.message),
        exit_code=EXIT_ERROR,
    )
