"""The gate's rows one run writes, and only these: its start, its phase rows and current
phase, its heartbeat (which answers whether it must stop), and its finished record (the
document, every check, each scenario's request columns per role).

The pipeline writes the database through here only; the service's rules about gates (create,
claim, cancel, reap, callbacks) are gate/service's. A gate the reaper ended while this run went
on keeps that ending: `beat` says so, and `finish_run` stores it beside what the run saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.samples import Columns
from gate.analysis.types import Check
from gate.core.database import db_now, reading, transaction
from gate.core.vocabulary import FINISHED
from gate.models import CheckResult, GatePhase, GateRun, SampleSet
from gate.spec import GateSpec, spec_to_dict
from gate.verdict.document import EndedElsewhere, VerdictDocument
from gate.verdict.history import HistoryEntry, history_entry


def start_run(
    factory: sessionmaker[Session],
    gate_id: str,
    spec: GateSpec,
    *,
    started: datetime,
    worker: str | None,
) -> None:
    """Mark the gate running (creating its row when the command line runs it directly)."""
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id)
        if run is None:
            run = GateRun(id=gate_id, name=spec.name, spec=spec_to_dict(spec))
            s.add(run)
        run.state = "running"
        run.phase = "created"
        run.started_at = started
        run.worker = worker
        run.heartbeat_at = db_now(s)
        run.attempts = (run.attempts or 0) + 1
        run.reference_label = spec.reference.label
        run.candidate_label = spec.candidate.label


def record_phase(
    factory: sessionmaker[Session],
    gate_id: str,
    role: str,
    phase: str,
    at_s: float,
    detail: str | None,
) -> None:
    """One phase row, and the gate's current phase (`role:phase` for an engine's)."""
    phase = phase[:PHASE_CHARS]  # `scenario:<name>` of a long name: the column's width
    with transaction(factory) as s:
        s.add(GatePhase(gate_id=gate_id, role=role, phase=phase, at_s=at_s, detail=detail))
        run = s.get(GateRun, gate_id)
        if run is not None:
            run.phase = (phase if role == "gate" else f"{role}:{phase}")[:PHASE_CHARS]


PHASE_CHARS = 64  # gate_phases.phase and gates.phase


def beat(
    factory: sessionmaker[Session], gate_id: str, progress: dict[str, Any] | None
) -> str | None:
    """Write a running gate's heartbeat and progress; return why it must stop, if it must."""
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id)
        if run is None:
            return "the gate's record was deleted"
        if run.state != "running":  # the reaper ended it: our worker looked lost
            return f"the gate was ended elsewhere while running ({run.reason})"
        run.heartbeat_at = db_now(s)
        run.progress = progress or None
        if run.cancel_requested:
            return run.reason or "cancelled on request before the gate could decide"
        return None


def _finite(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def _check_row(gate_id: str, c: Check) -> CheckResult:
    lo, hi = c.interval if c.interval else (None, None)
    return CheckResult(
        gate_id=gate_id,
        check_id=c.id,
        group=c.group,
        scenario=c.scenario,
        metric=c.metric,
        quantile=c.quantile,
        reference=_finite(c.reference),
        candidate=_finite(c.candidate),
        ratio=_finite(c.ratio),
        interval_lo=_finite(lo),
        interval_hi=_finite(hi),
        threshold=_finite(c.threshold),
        decision=c.decision,
        samples_reference=c.samples[0],
        samples_candidate=c.samples[1],
        alpha=c.alpha,
        message=c.message,
    )


def finish_run(
    factory: sessionmaker[Session],
    document: VerdictDocument,
    checks: Sequence[Check],
    samples: Iterable[tuple[str, str, Columns]],
    *,
    finished: datetime,
) -> VerdictDocument:
    """Store a finished run: its document, every check, each scenario's request columns per
    role. A gate the reaper ended while it ran keeps that ending (its heartbeat looked lost):
    the document returned, and stored, says so beside what the run saw before it stopped."""
    gate_id = document.gate_id
    assert gate_id is not None
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id, with_for_update=True)
        assert run is not None
        if run.state in FINISHED:
            elsewhere = EndedElsewhere(state=run.state, reason=run.reason)
            document = document.model_copy(
                update={"ended_elsewhere": elsewhere, "state": run.state}
            )
        run.state = document.state
        run.phase = "finished"
        run.verdict = document.verdict
        run.reason = document.reason_text
        run.document = document.to_json()
        run.report_path = document.report
        run.finished_at = finished
        if document.testbed is not None:
            run.identity, run.aa = document.testbed.identity, document.testbed.aa
            run.history = history_entry(document).to_json()
        # A retry of this write whose first commit did land (its answer was lost) rewrites
        # the same rows instead of failing on them.
        s.execute(delete(SampleSet).where(SampleSet.gate_id == gate_id))
        s.execute(delete(CheckResult).where(CheckResult.gate_id == gate_id))
        for scenario, role, cols in samples:
            s.add(
                SampleSet(
                    gate_id=gate_id,
                    scenario=scenario,
                    role=role,
                    requests=len(cols),
                    columns=cols.to_bytes(),
                )
            )
        for c in checks:
            s.add(_check_row(gate_id, c))
    return document


def reference_history(
    factory: sessionmaker[Session], identity: str, gate_id: str, limit: int
) -> list[dict[str, float]] | None:
    """The reference figures of the last `limit` judged gates of `identity` (newest first),
    this one aside: what `record.finish` compares this run's reference with. None when the
    database could not be read; a stored entry that no longer reads is skipped: neither is a
    reason to fail the gate."""
    try:
        stored = _history_entries(factory, identity, gate_id, limit)
    except SQLAlchemyError:
        return None
    out = []
    for entry in stored:
        try:
            out.append(HistoryEntry.model_validate(entry).reference)
        except ValueError:
            continue
    return [figures for figures in out if figures]


def _history_entries(
    factory: sessionmaker[Session], identity: str, gate_id: str, limit: int
) -> Sequence[Any]:
    with reading(factory) as s:
        return s.scalars(
            select(GateRun.history)
            .where(
                GateRun.identity == identity,
                GateRun.id != gate_id,
                GateRun.state == "complete",
                GateRun.history.is_not(None),
            )
            .order_by(GateRun.finished_at.desc())
            .limit(limit)
        ).all()
