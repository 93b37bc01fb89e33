"""Gate records as the service sees them: create (idempotently), read, list, cancel, and end
the gates whose worker was lost.

Pure database work over a sessionmaker; the API, the Celery tasks and the in-process worker
are thin layers over these functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.samples import Columns
from gate.analysis.types import Check
from gate.core.clock import now
from gate.core.database import db_now, reading, transaction
from gate.core.errors import DatabaseWaited as DatabaseWaited  # raised by reap_lost
from gate.core.errors import GateConflict as GateConflict  # these four lived here: re-exported
from gate.core.errors import GateError
from gate.core.errors import GateForbidden as GateForbidden
from gate.core.errors import GateNotFound as GateNotFound
from gate.core.errors import TooManyGates as TooManyGates
from gate.core.vocabulary import FINISHED, FinishedState
from gate.models import (
    CheckResult,
    GatePhase,
    GateRun,
    GpuLease,
    Reservation,
    SampleSet,
    WebhookDelivery,
)
from gate.spec import GateSpec, spec_to_dict
from gate.verdict.build import ended_document
from gate.verdict.document import EndedElsewhere, VerdictDocument
from gate.verdict.summary import ANSWER_ITEMS, bounded, stored_summary


def _aware(t: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes for timezone-aware columns; they are UTC."""
    if t is None:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def spec_key(spec: GateSpec) -> str:
    """The idempotency key of a spec: the SHA-256 of its canonical JSON (reference,
    candidate, scenarios, shape, policy, seed: everything that decides what is run)."""
    full = spec.model_dump(mode="json")  # defaults included: the same spec, however written
    canonical = json.dumps(full, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def scoped_key(source: str, caller: str, *parts: str) -> str:
    """An idempotency key in the namespace of one source and one caller: the same words from
    another system, or from another token, never name the same gate (`Idempotency-Key: x`
    from CI job A is not Argo's `x`, nor job B's)."""
    raw = json.dumps([source, caller, *parts])  # unambiguous: no part can shift another
    return hashlib.sha256(raw.encode()).hexdigest()


def _same_gate(run: GateRun, spec: GateSpec, source: str) -> bool:
    from gate.spec import parse_spec

    if run.source != source:
        return False
    try:
        return spec_key(parse_spec(run.spec, "stored spec")) == spec_key(spec)
    except GateError:
        return False


def create_gate(
    factory: sessionmaker[Session],
    spec: GateSpec,
    *,
    source: str = "api",
    idempotency_key: str | None = None,
    callback: dict[str, Any] | None = None,
    owner: str | None = None,
    max_active: int | None = None,
) -> tuple[GateRun, bool]:
    """A pending gate for `spec`; with a key, the gate already made under it if there is
    one, which must be a gate of the same source for the same spec (else GateConflict: a key
    never hands one caller's verdict to another request); a new gate past `max_active` active
    gates of its owner is TooManyGates. Returns (gate, created)."""
    import uuid

    if idempotency_key is not None:
        existing = find_by_key(factory, idempotency_key)
        if existing is not None:
            return _reused(existing, spec, source), False
    run = GateRun(
        id=uuid.uuid4().hex,
        name=spec.name,
        spec=spec_to_dict(spec),
        state="pending",
        phase="queued",
        source=source,
        idempotency_key=idempotency_key,
        owner=owner,
        reference_label=spec.reference.label,
        candidate_label=spec.candidate.label,
        callback=callback,
        attempts=0,
        cancel_requested=False,
        created_at=now(),
    )
    try:
        with transaction(factory) as s:
            if max_active is not None and owner is not None:
                existing = _within_quota(s, owner, max_active, idempotency_key)
                if existing is not None:  # a concurrent ensure made it while we waited
                    return _reused(existing, spec, source), False
            s.add(run)
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = find_by_key(factory, idempotency_key)  # a concurrent ensure won the race
        if existing is None:
            raise
        return _reused(existing, spec, source), False
    return run, True


def _within_quota(
    s: Session, owner: str, max_active: int, idempotency_key: str | None
) -> GateRun | None:
    """Inside the create's transaction, under the owner's lock: TooManyGates past the cap, or
    the gate a concurrent request made under the same key meanwhile. The count and the insert
    are one transaction: 40 concurrent creates from one token left 27-40 active gates against
    a cap of 20 when the count was read in a transaction of its own."""
    _lock_owner(s, owner)
    if idempotency_key is not None:
        existing = s.scalars(
            select(GateRun).where(GateRun.idempotency_key == idempotency_key)
        ).first()
        if existing is not None:
            return existing
    if _count_active(s, owner) >= max_active:
        raise TooManyGates(
            f"this caller already has {max_active} pending or running gates "
            "(GATE_MAX_ACTIVE_GATES_PER_TOKEN); wait for one to finish"
        )
    return None


QUOTA_LOCK = 0x6A7E_0002  # pg_advisory_xact_lock namespace: one owner's creates, one at a time


def _lock_owner(s: Session, owner: str) -> None:
    """Serialise the creates of one owner until this transaction ends. PostgreSQL: a
    transaction-scoped advisory lock on (namespace, hash of the owner), so two owners rarely
    wait on each other and nothing is left locked by a crash. SQLite: the transaction's BEGIN
    IMMEDIATE already holds the database's one write lock, taken before the count is read.
    Under READ COMMITTED (PostgreSQL's default) the count, a later statement, sees every
    create committed before the lock was granted."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(
            text(
                "SELECT pg_advisory_xact_lock(CAST(:ns AS integer), hashtext(CAST(:owner AS text)))"
            ),
            {"ns": QUOTA_LOCK, "owner": owner},
        )


def _reused(existing: GateRun, spec: GateSpec, source: str) -> GateRun:
    if not _same_gate(existing, spec, source):
        raise GateConflict(
            f"this idempotency key already names gate {existing.id}, which is for another "
            "spec or candidate; use a new key for a new gate"
        )
    return existing


def active_gates(factory: sessionmaker[Session], owner: str) -> int:
    """How many pending or running gates `owner` has."""
    with reading(factory) as s:
        return _count_active(s, owner)


def _count_active(s: Session, owner: str) -> int:
    return int(
        s.scalar(
            select(func.count())
            .select_from(GateRun)
            .where(GateRun.owner == owner, GateRun.state.in_(("pending", "running")))
        )
        or 0
    )


def find_by_key(factory: sessionmaker[Session], key: str) -> GateRun | None:
    with reading(factory) as s:
        return s.scalars(select(GateRun).where(GateRun.idempotency_key == key)).first()


def get_gate(factory: sessionmaker[Session], gate_id: str) -> GateRun:
    with reading(factory) as s:
        run = s.get(GateRun, gate_id)
        if run is None:
            raise GateNotFound(gate_id)
        return run


def list_phases(
    factory: sessionmaker[Session], gate_id: str, after_id: int = 0, limit: int = 500
) -> list[GatePhase]:
    """The gate's and its engines' phases recorded after phase row `after_id`, in order."""
    with reading(factory) as s:
        if s.get(GateRun, gate_id) is None:
            raise GateNotFound(gate_id)
        return list(
            s.scalars(
                select(GatePhase)
                .where(GatePhase.gate_id == gate_id, GatePhase.id > after_id)
                .order_by(GatePhase.id)
                .limit(limit)
            )
        )


def all_phases(factory: sessionmaker[Session], gate_id: str) -> list[GatePhase]:
    """Every phase row of the gate and its engines, in order (the live page shows them all)."""
    with transaction(factory) as s:
        return list(
            s.scalars(select(GatePhase).where(GatePhase.gate_id == gate_id).order_by(GatePhase.id))
        )


def sample_columns(factory: sessionmaker[Session], gate_id: str) -> dict[str, dict[str, Columns]]:
    """The gate's stored samples: scenario -> role -> columns."""
    with transaction(factory) as s:
        rows = s.execute(
            select(SampleSet.scenario, SampleSet.role, SampleSet.columns)
            .where(SampleSet.gate_id == gate_id)
            .order_by(SampleSet.id)
        ).all()
    out: dict[str, dict[str, Columns]] = {}
    for scenario, role, blob in rows:
        out.setdefault(scenario, {})[role] = Columns.from_bytes(blob)
    return out


def find_delivery(factory: sessionmaker[Session], key: str) -> WebhookDelivery | None:
    """The webhook delivery recorded under `key`, if one was."""
    with transaction(factory) as s:
        return s.get(WebhookDelivery, key)


def record_delivery(
    factory: sessionmaker[Session], key: str, source: str, body_sha256: str, gate_id: str
) -> bool:
    """Record a delivery and the gate it made; False when a concurrent redelivery recorded
    it first (the gate is the same: same idempotency key)."""
    try:
        with transaction(factory) as s:
            s.add(WebhookDelivery(id=key, source=source, body_sha256=body_sha256, gate_id=gate_id))
    except IntegrityError:
        return False
    return True


@dataclass(frozen=True)
class ServiceCounts:
    """What /metrics reports from the database, read in one transaction."""

    gates: list[tuple[str, str | None, int]]  # state, verdict, count
    active_reservations: int
    gpus_held: int
    phases: list[tuple[str, str, str, float]]  # gate id, role, phase, at_s; in that order


def service_counts(factory: sessionmaker[Session], phase_limit: int = 200_000) -> ServiceCounts:
    with transaction(factory) as s:
        gates = [
            (state, verdict, int(n))
            for state, verdict, n in s.execute(
                select(GateRun.state, GateRun.verdict, func.count()).group_by(
                    GateRun.state, GateRun.verdict
                )
            )
        ]
        active = s.scalar(
            select(func.count()).select_from(Reservation).where(Reservation.state == "active")
        )
        held = s.scalar(select(func.count()).select_from(GpuLease))
        rows = s.execute(
            select(GatePhase.gate_id, GatePhase.role, GatePhase.phase, GatePhase.at_s)
            .order_by(GatePhase.gate_id, GatePhase.role, GatePhase.at_s)
            .limit(phase_limit)
        ).all()
    return ServiceCounts(gates, active or 0, held or 0, [(g, r, p, at) for g, r, p, at in rows])


@dataclass(frozen=True)
class GateFilter:
    state: str | None = None
    verdict: str | None = None
    candidate: str | None = None  # substring of the candidate's label
    name: str | None = None
    limit: int = 50
    offset: int = 0


def list_gates(factory: sessionmaker[Session], f: GateFilter) -> tuple[list[GateRun], int]:
    """Newest first, with the total count of gates matching the filter."""
    q = select(GateRun)
    if f.state:
        q = q.where(GateRun.state == f.state)
    if f.verdict:
        q = q.where(GateRun.verdict == f.verdict)
    if f.name:
        q = q.where(GateRun.name == f.name)
    if f.candidate:
        pattern = "%" + f.candidate.replace("\\", "\\\\").replace("%", r"\%").replace("_", r"\_")
        q = q.where(GateRun.candidate_label.like(pattern + "%", escape="\\"))
    with reading(factory) as s:
        total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
        rows = s.scalars(
            q.order_by(GateRun.created_at.desc(), GateRun.id).limit(f.limit).offset(f.offset)
        ).all()
        return list(rows), int(total)


def request_cancel(
    factory: sessionmaker[Session],
    gate_id: str,
    reason: str | None = None,
    *,
    caller: str | None = None,
    admin: bool = False,
) -> GateRun:
    """A pending gate is cancelled at once (it holds nothing); a running one is asked to stop
    and its runner tears down and releases at its next heartbeat, ending with `reason`; a
    finished one cannot be. Only the gate's owner (`caller`) or an admin may: a CI job's
    token cannot hold another system's rollout by cancelling its gate."""
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id, with_for_update=True)
        if run is None:
            raise GateNotFound(gate_id)
        if not admin and (run.owner is None or run.owner != caller):
            raise GateForbidden(
                f"gate {gate_id} was started by another token (or by the {run.source} "
                "integration); only that token or an admin token may cancel it"
            )
        if run.state in FINISHED:
            raise GateConflict(f"gate {gate_id} already finished ({run.state}); nothing to cancel")
        run.cancel_requested = True
        if run.state == "pending":
            _end(run, "cancelled", "gate.cancelled", reason or "cancelled before it started")
        elif reason:
            run.reason = reason  # what the runner ends with
        return run


def claim(factory: sessionmaker[Session], gate_id: str, worker: str) -> GateRun | None:
    """Take a pending gate for `worker`; None when it is not pending any more (another
    delivery of the same task already ran it, or it was cancelled): running it twice is
    impossible because the update is conditional on the state."""
    with transaction(factory) as s:
        taken = s.scalars(
            update(GateRun)
            .where(GateRun.id == gate_id, GateRun.state == "pending")
            .values(state="running", phase="claimed", worker=worker, heartbeat_at=db_now(s))
            .returning(GateRun.id)
        ).all()
        if not taken:
            return None
        return s.get(GateRun, gate_id)


def _end(run: GateRun, state: FinishedState, check: str, message: str) -> None:
    finished = now()
    run.state = state
    run.phase = "finished"
    run.verdict = "hold"
    run.reason = message
    run.finished_at = finished
    run.document = ended_document(run.id, run.name, state, check, message, finished).to_json()


def reap_lost(
    factory: sessionmaker[Session],
    lost_after_s: float,
    at: datetime | None = None,
    *,
    spare: Collection[str] = (),
    broker: bool = False,
    spared: list[str] | None = None,
    max_wait_s: float | None = None,
) -> list[str]:
    """End every running gate whose heartbeat stopped: hold with the reason, its reservation
    released. Its engine processes died with their worker (they are launched with a parent
    death signal); Kubernetes objects are owned by the reservation's Lease and collected.

    Heartbeats are compared with the database's clock (`at` for tests). `spare`: gates known
    alive another way (this process runs them; the broker holds their proof of life), which a
    database outage kept from writing: they are not ended. `broker`: whether the broker was
    asked, for the reason's words. `spared` collects the stale gates that were spared.
    `max_wait_s`: a pass that waited longer than this for the database (a write lock held
    elsewhere) ends nobody: the gates' heartbeats waited just as long.

    Raises `DatabaseWaited` for such a pass."""
    ended: list[str] = []
    with transaction(factory) as s:
        t0 = time.monotonic()
        at = at or db_now(s)
        if max_wait_s is not None and time.monotonic() - t0 > max_wait_s:
            raise DatabaseWaited(time.monotonic() - t0)
        cutoff = at - timedelta(seconds=lost_after_s)
        lost = s.scalars(
            select(GateRun)
            .where(GateRun.state == "running", GateRun.heartbeat_at < cutoff)
            .with_for_update(skip_locked=True)
        ).all()
        for run in lost:
            if run.id in spare:
                if spared is not None:
                    spared.append(run.id)
                continue
            _end_lost(s, run, at, broker)
            ended.append(run.id)
    return ended


def _end_lost(s: Session, run: GateRun, at: datetime, broker: bool) -> None:
    last = _aware(run.heartbeat_at)
    ago = (at - last).total_seconds() if last else float("nan")
    worker = run.worker or "unknown worker"
    silent = (
        "to the database and to the broker: it died or is cut off from both"
        if broker
        else "to the database (no broker to ask whether it is alive)"
    )
    _end_released(
        s,
        run,
        at,
        f"the worker running this gate ({worker}) stopped sending heartbeats "
        f"{ago:.0f}s ago, {silent}; the gate ended without a verdict",
    )


def running_workers(factory: sessionmaker[Session]) -> list[str]:
    """The worker names of the running gates."""
    with reading(factory) as s:
        return sorted(
            w
            for w in s.scalars(select(GateRun.worker).where(GateRun.state == "running").distinct())
            if w
        )


def end_dead_workers(
    factory: sessionmaker[Session], workers: Collection[str], by: str
) -> list[str]:
    """End the running gates of `workers`, processes `by` (a successor) proved dead
    (`gate.runs.liveness.dead_workers`): as a reaper ends a lost gate, without waiting for
    their heartbeats to age."""
    if not workers:
        return []
    ended: list[str] = []
    with transaction(factory) as s:
        at = db_now(s)
        runs = s.scalars(
            select(GateRun)
            .where(GateRun.state == "running", GateRun.worker.in_(list(workers)))
            .with_for_update(skip_locked=True)
        ).all()
        for run in runs:
            _end_released(
                s,
                run,
                at,
                f"the worker running this gate ({run.worker}) died: {by}, started after it, "
                "found it gone; the gate ended without a verdict",
            )
            ended.append(run.id)
    return ended


def _end_released(s: Session, run: GateRun, at: datetime, message: str) -> None:
    """End a gate whose worker is gone (`worker_lost`), its reservations released."""
    _end(run, "error", "gate.worker_lost", message)
    held = list(
        s.scalars(
            select(Reservation.id)
            .where(Reservation.gate_id == run.id, Reservation.state == "active")
            .with_for_update()  # the reservation rows first: leases.py's lock order
        )
    )
    if held:
        s.execute(delete(GpuLease).where(GpuLease.reservation_id.in_(held)))
        s.execute(
            update(Reservation)
            .where(Reservation.id.in_(held))
            .values(state="released", released_at=at, release_reason="worker lost")
        )


# -- stuck pending gates and undelivered callbacks (the reapers' other two jobs) ---------------

CALLBACK_ATTEMPTS = 5
CALLBACK_RETRY_S = 30.0  # times the attempt number: 30 s, 60 s, 90 s, 120 s between tries


def stale_pending(
    factory: sessionmaker[Session], older_than_s: float, at: datetime | None = None
) -> list[str]:
    """Gates still pending `older_than_s` after they were created, oldest first."""
    cutoff = (at or now()) - timedelta(seconds=older_than_s)
    with reading(factory) as s:
        return list(
            s.scalars(
                select(GateRun.id)
                .where(GateRun.state == "pending", GateRun.created_at < cutoff)
                .order_by(GateRun.created_at)
            )
        )


def due_callbacks(
    factory: sessionmaker[Session], at: datetime | None = None, limit: int = 50
) -> list[str]:
    """Finished gates whose commit-status callback is still owed and due for a try."""
    at = at or now()
    with reading(factory) as s:
        rows = s.execute(
            select(GateRun.id, GateRun.callback_attempts, GateRun.callback_tried_at)
            .where(
                GateRun.state.in_(FINISHED),
                GateRun.callback.is_not(None),
                GateRun.callback_sent_at.is_(None),
                GateRun.callback_attempts < CALLBACK_ATTEMPTS,
            )
            .order_by(GateRun.finished_at)
        ).all()
    # The spacing grows with the attempts: checked here rather than in portable SQL.
    due = [gid for gid, n, tried in rows if _spaced(tried, n, at)]
    return due[:limit]


def _spaced(tried: datetime | None, attempts: int, at: datetime) -> bool:
    last = _aware(tried)
    return last is None or (at - last).total_seconds() >= CALLBACK_RETRY_S * max(1, attempts)


def claim_callback(
    factory: sessionmaker[Session], gate_id: str, at: datetime | None = None
) -> GateRun | None:
    """Take the next delivery attempt of a gate's callback; None when it is not owed, not
    due, or another process took this attempt (the update is conditional on the count)."""
    at = at or now()
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id)
        if (
            run is None
            or run.state not in FINISHED
            or not run.callback
            or run.callback_sent_at is not None
            or run.callback_attempts >= CALLBACK_ATTEMPTS
        ):
            return None
        if not _spaced(run.callback_tried_at, run.callback_attempts, at):
            return None
        seen = run.callback_attempts
        taken = s.scalars(
            update(GateRun)
            .where(GateRun.id == gate_id, GateRun.callback_attempts == seen)
            .values(callback_attempts=seen + 1, callback_tried_at=at)
            .returning(GateRun.id)
            .execution_options(synchronize_session=False)
        ).all()
        if not taken:
            return None
        s.refresh(run)
        s.expunge(run)
        return run


def record_callback(
    factory: sessionmaker[Session], gate_id: str, *, sent: bool, final: bool, result: str
) -> None:
    """What the attempt got: sent (2xx), refused for good (a 4xx: no retry), or a failure
    worth retrying (no answer, 5xx) while attempts remain."""
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id, with_for_update=True)
        if run is None:
            return
        run.callback_result = result[:200]
        if sent:
            run.callback_sent_at = now()
        elif final:
            run.callback_attempts = CALLBACK_ATTEMPTS


def lost_gate_specs(
    factory: sessionmaker[Session], within_s: float, at: datetime | None = None
) -> list[dict[str, Any]]:
    """The specs of gates a reaper ended because their worker was lost, in the last
    `within_s` seconds: what they launched on clusters may still be running."""
    cutoff = (at or now()) - timedelta(seconds=within_s)
    with reading(factory) as s:
        rows = s.execute(
            select(GateRun.spec, GateRun.document).where(
                GateRun.state == "error", GateRun.finished_at >= cutoff
            )
        ).all()
    return [
        spec
        for spec, doc in rows
        if isinstance(doc, dict) and (doc.get("error") or {}).get("code") == "worker_lost"
    ]


def read_verdict(factory: sessionmaker[Session], gate_id: str, public_url: str) -> dict[str, Any]:
    """`verdict_summary` of a stored gate, reading only the five columns it needs while the
    gate runs (no spec, no document): what pollers of running gates cost the database. A
    finished gate's document is read too, for its summary (the API keeps a finished gate's
    answer, so that is once per gate)."""
    cols = (GateRun.id, GateRun.state, GateRun.phase, GateRun.verdict, GateRun.reason)
    with reading(factory) as s:
        row = s.execute(select(*cols).where(GateRun.id == gate_id)).first()
        if row is None:
            raise GateNotFound(gate_id)
        document = None
        if row.state in FINISHED:
            document = s.scalar(select(GateRun.document).where(GateRun.id == gate_id))
    return _verdict_summary(row, document, public_url)


def verdict_summary(run: GateRun, public_url: str) -> dict[str, Any]:
    """The small object rollout controllers poll: state, verdict (null until decided),
    reason, the verdict in one line with its warnings and what a continue could not show
    (gate/verdict/summary.py; each list at most ANSWER_ITEMS long, `*_omitted` counts the
    rest), report_url. `state` is the gate's own, as every endpoint names it (a cancelled
    gate is `cancelled`, with a hold)."""
    return _verdict_summary(run, run.document, public_url)


def _verdict_summary(run: Any, document: Any, public_url: str) -> dict[str, Any]:
    finished = run.state in FINISHED
    said = stored_summary(run.verdict, document, run.reason) if finished else None
    warnings, warnings_omitted = bounded(said.warnings if said else (), ANSWER_ITEMS)
    not_shown, not_shown_omitted = bounded(said.not_shown if said else (), ANSWER_ITEMS)
    return {
        "id": run.id,
        "state": run.state,
        "verdict": run.verdict if finished else None,
        "reason": run.reason if finished else f"gate is {run.state} ({run.phase})",
        "summary": said.line() if said else None,
        "warnings": [w.to_json() for w in warnings],
        "warnings_omitted": warnings_omitted,
        "not_shown": [n.to_json() for n in not_shown],
        "not_shown_omitted": not_shown_omitted,
        "report_url": f"{public_url.rstrip('/')}/gates/{run.id}",
    }


# -- one run's own records (the runner writes these, through here only) ----------------------


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


def fail_gate(factory: sessionmaker[Session], gate_id: str, check: str, message: str) -> list[int]:
    """End a gate that is still running (or pending) as an error with a hold; returns the
    reservations it still holds, for the caller to release."""
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id, with_for_update=True)
        if run is not None and run.state not in FINISHED:
            _end(run, "error", check, message)
        return list(
            s.scalars(
                select(Reservation.id).where(
                    Reservation.gate_id == gate_id, Reservation.state == "active"
                )
            )
        )


def pending_gate_ids(factory: sessionmaker[Session]) -> list[str]:
    """Every gate still waiting for a worker."""
    with reading(factory) as s:
        return list(s.scalars(select(GateRun.id).where(GateRun.state == "pending")))
