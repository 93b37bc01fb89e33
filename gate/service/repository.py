"""The gate service's queries: gate rows and the rows a gate owns (its phases, request
columns, webhook deliveries, the reservations it holds), over a session the caller opened.

Queries only: nothing here opens or ends a transaction, raises a domain error or decides a
rule (who may cancel, when a callback is due, what a lost gate's reason says); that is
gate/service/service.py's, which calls these inside its transactions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, func, select, text, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from gate.analysis.samples import Columns
from gate.core.vocabulary import FINISHED
from gate.models import (
    AlertDelivery,
    CheckResult,
    GatePhase,
    GateRun,
    GpuLease,
    Reservation,
    SampleSet,
    WebhookDelivery,
)
from gate.service.schemas import GateFilter, ServiceCounts

QUOTA_LOCK = 0x6A7E_0002  # pg_advisory_xact_lock namespace: one owner's creates, one at a time


def get(s: Session, gate_id: str, *, for_update: bool = False) -> GateRun | None:
    return s.get(GateRun, gate_id, with_for_update=for_update)


def by_key(s: Session, key: str) -> GateRun | None:
    """The gate made under an idempotency key, if one was."""
    return s.scalars(select(GateRun).where(GateRun.idempotency_key == key)).first()


def lock_owner(s: Session, owner: str) -> None:
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


def count_active(s: Session, owner: str) -> int:
    """How many pending or running gates `owner` has."""
    return int(
        s.scalar(
            select(func.count())
            .select_from(GateRun)
            .where(GateRun.owner == owner, GateRun.state.in_(("pending", "running")))
        )
        or 0
    )


def phases(
    s: Session, gate_id: str, after_id: int = 0, limit: int | None = None
) -> list[GatePhase]:
    """The gate's and its engines' phase rows after row `after_id`, in order."""
    q = (
        select(GatePhase)
        .where(GatePhase.gate_id == gate_id, GatePhase.id > after_id)
        .order_by(GatePhase.id)
    )
    return list(s.scalars(q if limit is None else q.limit(limit)))


def sample_columns(s: Session, gate_id: str) -> dict[str, dict[str, Columns]]:
    """The gate's stored samples: scenario -> role -> columns."""
    rows = s.execute(
        select(SampleSet.scenario, SampleSet.role, SampleSet.columns)
        .where(SampleSet.gate_id == gate_id)
        .order_by(SampleSet.id)
    ).all()
    out: dict[str, dict[str, Columns]] = {}
    for scenario, role, blob in rows:
        out.setdefault(scenario, {})[role] = Columns.from_bytes(blob)
    return out


def delivery(s: Session, key: str) -> WebhookDelivery | None:
    return s.get(WebhookDelivery, key)


def add_delivery(s: Session, key: str, source: str, body_sha256: str, gate_id: str) -> None:
    s.add(WebhookDelivery(id=key, source=source, body_sha256=body_sha256, gate_id=gate_id))


def counts(s: Session, phase_limit: int) -> ServiceCounts:
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


def list_gates(s: Session, f: GateFilter) -> tuple[list[GateRun], int]:
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
    total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = s.scalars(
        q.order_by(GateRun.created_at.desc(), GateRun.id).limit(f.limit).offset(f.offset)
    ).all()
    return list(rows), int(total)


def claim_pending(s: Session, gate_id: str, worker: str, at: datetime) -> bool:
    """Mark the gate running for `worker` if, and only if, it is still pending."""
    taken = s.scalars(
        update(GateRun)
        .where(GateRun.id == gate_id, GateRun.state == "pending")
        .values(state="running", phase="claimed", worker=worker, heartbeat_at=at)
        .returning(GateRun.id)
    ).all()
    return bool(taken)


def silent_since(s: Session, cutoff: datetime) -> Sequence[GateRun]:
    """Running gates whose last heartbeat is before `cutoff`, locked; those another
    transaction holds are skipped."""
    return s.scalars(
        select(GateRun)
        .where(GateRun.state == "running", GateRun.heartbeat_at < cutoff)
        .with_for_update(skip_locked=True)
    ).all()


def running_on(s: Session, workers: Collection[str]) -> Sequence[GateRun]:
    """The running gates of these workers, locked; those another transaction holds are
    skipped."""
    return s.scalars(
        select(GateRun)
        .where(GateRun.state == "running", GateRun.worker.in_(list(workers)))
        .with_for_update(skip_locked=True)
    ).all()


def running_workers(s: Session) -> list[str]:
    """The worker names of the running gates."""
    return sorted(
        w
        for w in s.scalars(select(GateRun.worker).where(GateRun.state == "running").distinct())
        if w
    )


def held_reservations(s: Session, gate_id: str, *, for_update: bool = False) -> list[int]:
    """The gate's active reservations (locked first when asked: leases.py's lock order)."""
    q = select(Reservation.id).where(Reservation.gate_id == gate_id, Reservation.state == "active")
    return list(s.scalars(q.with_for_update() if for_update else q))


def release_reservations(s: Session, ids: list[int], at: datetime, reason: str) -> None:
    s.execute(delete(GpuLease).where(GpuLease.reservation_id.in_(ids)))
    s.execute(
        update(Reservation)
        .where(Reservation.id.in_(ids))
        .values(state="released", released_at=at, release_reason=reason)
    )


def pending_since(s: Session, cutoff: datetime | None = None) -> list[str]:
    """Pending gates (created before `cutoff`, when given), oldest first."""
    q = select(GateRun.id).where(GateRun.state == "pending")
    if cutoff is not None:
        q = q.where(GateRun.created_at < cutoff).order_by(GateRun.created_at)
    return list(s.scalars(q))


def unsent_callbacks(s: Session, max_attempts: int) -> list[tuple[str, int, datetime | None]]:
    """(gate id, attempts, last try) of the finished gates whose callback was not sent and
    has attempts left, in the order they finished."""
    rows = s.execute(
        select(GateRun.id, GateRun.callback_attempts, GateRun.callback_tried_at)
        .where(
            GateRun.state.in_(FINISHED),
            GateRun.callback.is_not(None),
            GateRun.callback_sent_at.is_(None),
            GateRun.callback_attempts < max_attempts,
        )
        .order_by(GateRun.finished_at)
    ).all()
    return [(gid, n, tried) for gid, n, tried in rows]


def _take_attempt(
    s: Session,
    key: InstrumentedAttribute[Any],
    count: InstrumentedAttribute[int],
    tried: InstrumentedAttribute[Any],
    row: object,
    seen: int,
    at: datetime,
) -> bool:
    """Count one more attempt of a delivery (a callback, an alert) if its count is still `seen`:
    the compare-and-set that lets many senders share the work and send each attempt once."""
    taken = s.scalars(
        update(key.class_)
        .where(key == row, count == seen)
        .values({count: seen + 1, tried: at})
        .returning(key)
        .execution_options(synchronize_session=False)
    ).all()
    return bool(taken)


def take_callback_attempt(s: Session, gate_id: str, seen: int, at: datetime) -> bool:
    """Count one more callback attempt if the count is still `seen` (nobody took it)."""
    return _take_attempt(
        s, GateRun.id, GateRun.callback_attempts, GateRun.callback_tried_at, gate_id, seen, at
    )


def errors_since(s: Session, cutoff: datetime) -> list[tuple[dict[str, Any], Any]]:
    """(spec, document) of the gates that ended in error from `cutoff` on."""
    rows = s.execute(
        select(GateRun.spec, GateRun.document).where(
            GateRun.state == "error", GateRun.finished_at >= cutoff
        )
    ).all()
    return [(spec, doc) for spec, doc in rows]


def verdict_row(s: Session, gate_id: str) -> Row[str, str, str, str | None, str | None] | None:
    """The five columns a running gate's verdict summary needs (no spec, no document)."""
    cols = (GateRun.id, GateRun.state, GateRun.phase, GateRun.verdict, GateRun.reason)
    return s.execute(select(*cols).where(GateRun.id == gate_id)).first()


def document(s: Session, gate_id: str) -> Any:
    """The gate's stored verdict document (None until it finished)."""
    return s.scalar(select(GateRun.document).where(GateRun.id == gate_id))


# -- verdict alerts -----------------------------------------------------------------------


def alert_rows(s: Session, gate_id: str) -> list[AlertDelivery]:
    """A gate's alert deliveries, in the order they were planned."""
    q = select(AlertDelivery).where(AlertDelivery.gate_id == gate_id).order_by(AlertDelivery.id)
    return list(s.scalars(q))


def owed_alerts(s: Session, max_attempts: int, limit: int) -> list[AlertDelivery]:
    """Alerts not done, with attempts left, of finished gates (oldest first)."""
    q = (
        select(AlertDelivery)
        .join(GateRun, GateRun.id == AlertDelivery.gate_id)
        .where(
            GateRun.state.in_(FINISHED),
            AlertDelivery.done.is_(False),
            AlertDelivery.attempts < max_attempts,
        )
        .order_by(AlertDelivery.id)
        .limit(limit)
    )
    return list(s.scalars(q))


def take_alert_attempt(s: Session, alert_id: int, seen: int, at: datetime) -> bool:
    """Count one more attempt of an alert if its count is still `seen` (nobody took it)."""
    d = AlertDelivery
    return _take_attempt(s, d.id, d.attempts, d.tried_at, alert_id, seen, at)


# -- a spec's history (gate/service/history.py) and the per-check series of /metrics ----------


IdentityRow = tuple[str, str, int, int, datetime | None]


def history_identities(s: Session, limit: int, offset: int) -> tuple[list[IdentityRow], int]:
    """Each spec identity with a history: (identity, name, gates, A/A gates, last finished),
    the most recently finished first, and how many identities there are."""
    last = func.max(GateRun.finished_at)
    q = (
        select(
            GateRun.identity,
            func.max(GateRun.name),
            func.count(),
            func.count().filter(GateRun.aa.is_(True)),
            last,
        )
        .where(GateRun.identity.is_not(None), GateRun.history.is_not(None))
        .group_by(GateRun.identity)
    )
    total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = s.execute(q.order_by(last.desc(), GateRun.identity).limit(limit).offset(offset)).all()
    return [(str(i), str(n), int(g), int(a), at) for i, n, g, a, at in rows], int(total)


def history_page(
    s: Session, identity: str, limit: int, before: datetime | None
) -> tuple[list[GateRun], int]:
    """One identity's finished gates, newest first, finished before `before` (the page's
    cursor), and how many it has in all (index ix_gates_identity_finished)."""
    q = select(GateRun).where(GateRun.identity == identity, GateRun.history.is_not(None))
    total = s.scalar(select(func.count()).select_from(q.subquery())) or 0
    if before is not None:
        q = q.where(GateRun.finished_at < before)
    rows = s.scalars(q.order_by(GateRun.finished_at.desc(), GateRun.id).limit(limit)).all()
    return list(rows), int(total)


def finished_by_spec(s: Session) -> list[tuple[str, str, bool, int]]:
    """Finished gates of every spec by verdict and A/A: (name, verdict, aa, count)."""
    rows = s.execute(
        select(GateRun.name, GateRun.verdict, GateRun.aa, func.count())
        .where(GateRun.state.in_(FINISHED), GateRun.verdict.is_not(None))
        .group_by(GateRun.name, GateRun.verdict, GateRun.aa)
    ).all()
    return [(name, str(verdict), bool(aa), int(n)) for name, verdict, aa, n in rows]


FinishedRow = tuple[str, str, str | None, datetime | None, datetime | None]
CheckRow = tuple[str, str, str | None, float | None, str]


def recent_finished(s: Session, window: int) -> list[FinishedRow]:
    """The last `window` finished gates: (id, name, verdict, started_at, finished_at)."""
    return [
        (i, n, v, st, fin)
        for i, n, v, st, fin in s.execute(
            select(
                GateRun.id, GateRun.name, GateRun.verdict, GateRun.started_at, GateRun.finished_at
            )
            .where(GateRun.state.in_(FINISHED), GateRun.finished_at.is_not(None))
            .order_by(GateRun.finished_at.desc())
            .limit(window)
        ).all()
    ]


def checks_of(s: Session, gate_ids: Collection[str]) -> list[CheckRow]:
    """The checks of these gates: (gate id, check id, scenario, ratio, decision)."""
    if not gate_ids:
        return []
    return [
        (g, c, sc, r, d)
        for g, c, sc, r, d in s.execute(
            select(
                CheckResult.gate_id,
                CheckResult.check_id,
                CheckResult.scenario,
                CheckResult.ratio,
                CheckResult.decision,
            ).where(CheckResult.gate_id.in_(list(gate_ids)))
        ).all()
    ]


def oldest_active(s: Session) -> list[tuple[str, datetime | None]]:
    """The oldest pending gate's creation and the oldest running gate's start."""
    pending = s.scalar(select(func.min(GateRun.created_at)).where(GateRun.state == "pending"))
    running = s.scalar(select(func.min(GateRun.started_at)).where(GateRun.state == "running"))
    return [("pending", pending), ("running", running)]
