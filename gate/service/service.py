"""The gate service's rules: gates as callers see them. Submit (idempotently, within the
owner's quota), read, list, cancel, claim, end the gates whose worker was lost, owe and claim
commit-status callbacks, and answer the verdict summary rollout controllers poll.

Each function is one unit of work over a sessionmaker: it opens the transaction, asks
gate/service/repository.py its queries and decides. The API, the Celery tasks and the
in-process worker are thin layers over these functions. The rows one run writes (its phases,
heartbeat, finished record) are the pipeline's own: gate/runs/rows.py.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.samples import Columns
from gate.core.clock import now
from gate.core.database import db_now, reading, transaction
from gate.core.errors import (
    DatabaseWaited,
    GateConflict,
    GateError,
    GateForbidden,
    GateNotFound,
    TooManyGates,
)
from gate.core.vocabulary import FINISHED, FinishedState
from gate.models import AlertDelivery, GatePhase, GateRun, WebhookDelivery
from gate.service import repository
from gate.service.schemas import GateFilter, SaidInAnswer, ServiceCounts, VerdictSummary
from gate.spec import GateSpec, parse_spec, spec_to_dict
from gate.verdict.build import ended_document
from gate.verdict.summary import ANSWER_ITEMS, bounded, stored_summary

# -- idempotency and quotas: creating a gate ---------------------------------------------------


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
    alerts: Sequence[AlertDelivery] = (),
) -> tuple[GateRun, bool]:
    """A pending gate for `spec`; with a key, the gate already made under it if there is
    one, which must be a gate of the same source for the same spec (else GateConflict: a key
    never hands one caller's verdict to another request); a new gate past `max_active` active
    gates of its owner is TooManyGates; `alerts` (gate/service/alerts.py `plan`) are stored
    with it. Returns (gate, created)."""
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
            s.flush()  # the gate's row first: the alerts refer to it
            for alert in alerts:
                alert.gate_id = run.id
                s.add(alert)
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
    repository.lock_owner(s, owner)
    if idempotency_key is not None:
        existing = repository.by_key(s, idempotency_key)
        if existing is not None:
            return existing
    if repository.count_active(s, owner) >= max_active:
        raise TooManyGates(
            f"this caller already has {max_active} pending or running gates "
            "(GATE_MAX_ACTIVE_GATES_PER_TOKEN); wait for one to finish"
        )
    return None


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
        return repository.count_active(s, owner)


# -- reading gates -----------------------------------------------------------------------------


def find_by_key(factory: sessionmaker[Session], key: str) -> GateRun | None:
    with reading(factory) as s:
        return repository.by_key(s, key)


def get_gate(factory: sessionmaker[Session], gate_id: str) -> GateRun:
    with reading(factory) as s:
        run = repository.get(s, gate_id)
        if run is None:
            raise GateNotFound(gate_id)
        return run


def list_phases(
    factory: sessionmaker[Session], gate_id: str, after_id: int = 0, limit: int = 500
) -> list[GatePhase]:
    """The gate's and its engines' phases recorded after phase row `after_id`, in order."""
    with reading(factory) as s:
        if repository.get(s, gate_id) is None:
            raise GateNotFound(gate_id)
        return repository.phases(s, gate_id, after_id, limit)


def all_phases(factory: sessionmaker[Session], gate_id: str) -> list[GatePhase]:
    """Every phase row of the gate and its engines, in order (the live page shows them all)."""
    with transaction(factory) as s:
        return repository.phases(s, gate_id)


def sample_columns(factory: sessionmaker[Session], gate_id: str) -> dict[str, dict[str, Columns]]:
    """The gate's stored samples: scenario -> role -> columns."""
    with transaction(factory) as s:
        return repository.sample_columns(s, gate_id)


def list_gates(factory: sessionmaker[Session], f: GateFilter) -> tuple[list[GateRun], int]:
    """Newest first, with the total count of gates matching the filter."""
    with reading(factory) as s:
        return repository.list_gates(s, f)


def service_counts(factory: sessionmaker[Session], phase_limit: int = 200_000) -> ServiceCounts:
    with transaction(factory) as s:
        return repository.counts(s, phase_limit)


def find_delivery(factory: sessionmaker[Session], key: str) -> WebhookDelivery | None:
    """The webhook delivery recorded under `key`, if one was."""
    with transaction(factory) as s:
        return repository.delivery(s, key)


def record_delivery(
    factory: sessionmaker[Session], key: str, source: str, body_sha256: str, gate_id: str
) -> bool:
    """Record a delivery and the gate it made; False when a concurrent redelivery recorded
    it first (the gate is the same: same idempotency key)."""
    try:
        with transaction(factory) as s:
            repository.add_delivery(s, key, source, body_sha256, gate_id)
    except IntegrityError:
        return False
    return True


def pending_gate_ids(factory: sessionmaker[Session]) -> list[str]:
    """Every gate still waiting for a worker."""
    with reading(factory) as s:
        return repository.pending_since(s)


# -- cancel, claim, and the endings a gate gets from outside its run ---------------------------


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
        run = repository.get(s, gate_id, for_update=True)
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
        if not repository.claim_pending(s, gate_id, worker, db_now(s)):
            return None
        return repository.get(s, gate_id)


def fail_gate(factory: sessionmaker[Session], gate_id: str, check: str, message: str) -> list[int]:
    """End a gate that is still running (or pending) as an error with a hold; returns the
    reservations it still holds, for the caller to release."""
    with transaction(factory) as s:
        run = repository.get(s, gate_id, for_update=True)
        if run is not None and run.state not in FINISHED:
            _end(run, "error", check, message)
        return repository.held_reservations(s, gate_id)


def _end(run: GateRun, state: FinishedState, check: str, message: str) -> None:
    finished = now()
    run.state = state
    run.phase = "finished"
    run.verdict = "hold"
    run.reason = message
    run.finished_at = finished
    run.document = ended_document(run.id, run.name, state, check, message, finished).to_json()


def _aware(t: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes for timezone-aware columns; they are UTC."""
    if t is None:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


# -- the reapers: gates whose worker was lost --------------------------------------------------


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
        for run in repository.silent_since(s, at - timedelta(seconds=lost_after_s)):
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
        return repository.running_workers(s)


def end_dead_workers(
    factory: sessionmaker[Session], workers: Collection[str], by: str
) -> list[str]:
    """End the running gates of `workers`, processes `by` (a successor) proved dead
    (`gate.service.process_marks.dead_workers`): as a reaper ends a lost gate, without waiting
    for their heartbeats to age."""
    if not workers:
        return []
    ended: list[str] = []
    with transaction(factory) as s:
        at = db_now(s)
        for run in repository.running_on(s, workers):
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
    held = repository.held_reservations(s, run.id, for_update=True)
    if held:
        repository.release_reservations(s, held, at, "worker lost")


def stale_pending(
    factory: sessionmaker[Session], older_than_s: float, at: datetime | None = None
) -> list[str]:
    """Gates still pending `older_than_s` after they were created, oldest first."""
    cutoff = (at or now()) - timedelta(seconds=older_than_s)
    with reading(factory) as s:
        return repository.pending_since(s, cutoff)


def lost_gate_specs(
    factory: sessionmaker[Session], within_s: float, at: datetime | None = None
) -> list[dict[str, Any]]:
    """The specs of gates a reaper ended because their worker was lost, in the last
    `within_s` seconds: what they launched on clusters may still be running."""
    cutoff = (at or now()) - timedelta(seconds=within_s)
    with reading(factory) as s:
        rows = repository.errors_since(s, cutoff)
    return [
        spec
        for spec, doc in rows
        if isinstance(doc, dict) and (doc.get("error") or {}).get("code") == "worker_lost"
    ]


# -- commit-status callbacks owed by finished gates --------------------------------------------

CALLBACK_ATTEMPTS = 5
CALLBACK_RETRY_S = 30.0  # times the attempt number: 30 s, 60 s, 90 s, 120 s between tries


def due_callbacks(
    factory: sessionmaker[Session], at: datetime | None = None, limit: int = 50
) -> list[str]:
    """Finished gates whose commit-status callback is still owed and due for a try."""
    at = at or now()
    with reading(factory) as s:
        rows = repository.unsent_callbacks(s, CALLBACK_ATTEMPTS)
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
        run = repository.get(s, gate_id)
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
        if not repository.take_callback_attempt(s, gate_id, run.callback_attempts, at):
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
        run = repository.get(s, gate_id, for_update=True)
        if run is None:
            return
        run.callback_result = result[:200]
        if sent:
            run.callback_sent_at = now()
        elif final:
            run.callback_attempts = CALLBACK_ATTEMPTS


# -- the verdict summary rollout controllers poll ----------------------------------------------


def read_verdict(factory: sessionmaker[Session], gate_id: str, public_url: str) -> VerdictSummary:
    """`verdict_summary` of a stored gate, reading only the five columns it needs while the
    gate runs (no spec, no document): what pollers of running gates cost the database. A
    finished gate's document is read too, for its summary (the API keeps a finished gate's
    answer, so that is once per gate)."""
    with reading(factory) as s:
        row = repository.verdict_row(s, gate_id)
        if row is None:
            raise GateNotFound(gate_id)
        document = repository.document(s, gate_id) if row.state in FINISHED else None
    return _verdict_summary(row, document, public_url)


def verdict_summary(run: GateRun, public_url: str) -> VerdictSummary:
    """The small object rollout controllers poll: state, verdict (null until decided),
    reason, the verdict in one line with its warnings and what a continue could not show
    (gate/verdict/summary.py; each list at most ANSWER_ITEMS long, `*_omitted` counts the
    rest), report_url. `state` is the gate's own, as every endpoint names it (a cancelled
    gate is `cancelled`, with a hold)."""
    return _verdict_summary(run, run.document, public_url)


def said_in_answer(run: Any, document: Any) -> SaidInAnswer:
    """A gate's verdict in words for an answer (nothing said until it finished): its one line
    and each list bounded to ANSWER_ITEMS, the rest counted."""
    said = stored_summary(run.verdict, document, run.reason) if run.state in FINISHED else None
    warnings, warnings_omitted = bounded(said.warnings if said else (), ANSWER_ITEMS)
    not_shown, not_shown_omitted = bounded(said.not_shown if said else (), ANSWER_ITEMS)
    advisory, advisory_omitted = bounded(said.advisory if said else (), ANSWER_ITEMS)
    return SaidInAnswer(
        summary=said.line() if said else None,
        warnings=warnings,
        warnings_omitted=warnings_omitted,
        not_shown=not_shown,
        not_shown_omitted=not_shown_omitted,
        advisory=advisory,
        advisory_omitted=advisory_omitted,
    )


def _verdict_summary(run: Any, document: Any, public_url: str) -> VerdictSummary:
    finished = run.state in FINISHED
    return VerdictSummary(
        id=run.id,
        state=run.state,
        verdict=run.verdict if finished else None,
        reason=run.reason if finished else f"gate is {run.state} ({run.phase})",
        **said_in_answer(run, document),
        report_url=f"{public_url.rstrip('/')}/gates/{run.id}",
    )
