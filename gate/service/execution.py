"""Run one stored gate to its end, wherever it is executed (an in-process thread of the API
or a Celery worker): claim it, run it, notify its callback. Idempotent: a second delivery of
the same gate finds it claimed or finished and does nothing.

Whatever happens after the claim, the gate row ends finished: the runner records holds,
errors and cancels itself; an exception that escapes it (a bug) is recorded here as an error
with a hold. Only a process that dies outright leaves a running row behind, and the reaper
ends that one once its heartbeat is `lost_after_s` old.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import open_migrated
from gate.core.errors import GateError, WorkerStopping
from gate.core.settings import Settings
from gate.reservations import leases
from gate.reservations.service import MAX_WAIT_DELAY_S
from gate.runs.journal import persist_sync
from gate.runs.runner import GateOutcome, GateRunner
from gate.service import service
from gate.service.alerts import send_alerts
from gate.service.notify import notify
from gate.spec import parse_spec

if TYPE_CHECKING:
    from gate.models import GateRun

log = logging.getLogger("gate.runs")

#: The gate the current thread (or asyncio task) works for: log records carry it.
CURRENT_GATE: contextvars.ContextVar[str | None] = contextvars.ContextVar("gate_id", default=None)


def worker_name(kind: str) -> str:
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


def open_factory(settings: Settings) -> sessionmaker[Session]:
    """A sessionmaker on the settings' database, its schema at head (`open_migrated`)."""
    return open_migrated(settings.resolved_database_url())


class LogProgress:
    """Progress as log lines: one per gate or engine phase, one per scenario start and end,
    and one per quarter of a scenario's requests (what `gate worker` shows)."""

    def __init__(self, gate_id: str, logger: logging.Logger | None = None) -> None:
        self.gate_id = gate_id
        self.log = logger or logging.getLogger("gate.progress")
        self._quarter: dict[str, int] = {}

    def _extra(self, **kw: Any) -> dict[str, Any]:
        return {"gate_id": self.gate_id, **kw}

    def phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None:
        self.log.info(
            "%7.2fs %-9s %s%s",
            at_s,
            role,
            phase,
            f"  {detail}" if detail else "",
            extra=self._extra(role=role, phase=phase),
        )

    def scenario_started(self, name: str, total: int) -> None:
        self._quarter[name] = 0
        self.log.info(
            "scenario %s started: %s results expected",
            name,
            total or "open-ended",
            extra=self._extra(scenario=name),
        )

    def request_done(self, name: str, done: int, total: int) -> None:
        if total <= 0:
            return
        quarter = min(4, 4 * done // total)
        if quarter > self._quarter.get(name, 0):
            self._quarter[name] = quarter
            self.log.info(
                "scenario %s: %d/%d results", name, done, total, extra=self._extra(scenario=name)
            )

    def scenario_finished(self, name: str) -> None:
        self.log.info("scenario %s finished", name, extra=self._extra(scenario=name))


@dataclass
class _Running:
    loop: asyncio.AbstractEventLoop
    task: asyncio.Task[GateOutcome]
    runner: GateRunner


_running: dict[str, _Running] = {}
_running_lock = threading.RLock()  # re-entered by a signal handler on the main thread
_stopping: str | None = None  # set once this process stops: it claims no more gates


def running_gates() -> list[str]:
    """The gates this process is running now."""
    with _running_lock:
        return list(_running)


def stop_running_gates(reason: str) -> list[str]:
    """Ask every gate this process runs to stop now: each ends `cancelled` with a hold and
    `reason`, after its engines are torn down and its reservation released (what a worker's
    warm shutdown does). A gate already judging is left to finish: its teardown is under
    way. From then on the process claims no gate (`WorkerStopping`: the gate stays pending
    for another worker), and one that was claimed meanwhile is stopped as it starts. Safe to
    call from a signal handler or any thread."""
    global _stopping
    with _running_lock:
        _stopping = reason
        entries = list(_running.values())
    for entry in entries:
        entry.loop.call_soon_threadsafe(_stop, entry, reason)
    return [e.runner.gate_id for e in entries]


def _stop(entry: _Running, reason: str) -> None:
    if entry.task.done():
        return
    stopped = entry.runner.request_stop(reason)
    if stopped is None:  # still migrating, before its stages began: ask again shortly
        entry.loop.call_later(0.05, _stop, entry, reason)
    elif stopped:
        log.warning("gate %s: stopping (%s)", entry.runner.gate_id, reason)


async def _run_registered(runner: GateRunner) -> GateOutcome:
    task = asyncio.current_task()
    assert task is not None
    entry = _Running(asyncio.get_running_loop(), task, runner)
    with _running_lock:
        _running[runner.gate_id] = entry
        if _stopping is not None:  # claimed just as the process began to stop
            entry.loop.call_soon(_stop, entry, _stopping)
    try:
        return await runner.run()
    finally:
        with _running_lock:
            _running.pop(runner.gate_id, None)


class ProofOfLife(Protocol):
    def beat(self, gate_id: str, worker: str) -> None: ...

    def forget(self, gate_id: str) -> None: ...


def recovery_wait_s(settings: Settings) -> float:
    """How long a gate pending at a crash waits for GPUs held elsewhere, at least: as long as
    a reaper takes to end a gate whose worker died with the crash and release its GPUs (its
    heartbeat GATE_LOST_AFTER_S old, then a reaper's pass), plus the reservation's longest
    pause between tries."""
    return settings.lost_after_s + 2 * settings.heartbeat_s + MAX_WAIT_DELAY_S


def execute_gate(
    gate_id: str,
    settings: Settings,
    worker: str,
    factory: sessionmaker[Session] | None = None,
    liveness: ProofOfLife | None = None,
    *,
    min_wait_s: float = 0.0,
) -> str:
    """Run the stored gate `gate_id`; returns what happened: its final state, or `skipped`
    when it was not pending (already run, running elsewhere, or cancelled). `liveness`: a
    second proof of life beside the database heartbeat (the broker's, gate/worker).
    `min_wait_s`: wait at least this long for held GPUs, whatever the spec's `shape.wait_s`
    (a gate recovered after a crash, `recovery_wait_s`; at most GATE_MAX_WAIT_S)."""
    token = CURRENT_GATE.set(gate_id)
    try:
        return _execute(
            gate_id, settings, worker, factory or open_factory(settings), liveness, min_wait_s
        )
    finally:
        CURRENT_GATE.reset(token)
        if liveness is not None:
            liveness.forget(gate_id)


def _claim(factory: sessionmaker[Session], gate_id: str, worker: str) -> GateRun | None:
    """The gate, now ours; None (logged) when it was not pending."""
    extra = {"gate_id": gate_id}
    run = service.claim(factory, gate_id, worker)
    if run is None:
        current = service.get_gate(factory, gate_id)
        log.info(
            "gate %s not pending (%s, worker %s): skipped",
            gate_id,
            current.state,
            current.worker or "none",
            extra=extra,
        )
        return None
    log.info("gate %s claimed by %s", gate_id, worker, extra=extra)
    return run


def _execute(
    gate_id: str,
    settings: Settings,
    worker: str,
    factory: sessionmaker[Session],
    liveness: ProofOfLife | None = None,
    min_wait_s: float = 0.0,
) -> str:
    extra = {"gate_id": gate_id}
    if _stopping is not None:
        raise WorkerStopping(f"{worker} is shutting down; gate {gate_id} stays pending")
    run = _claim(factory, gate_id, worker)
    if run is None:
        return "skipped"
    try:
        spec = parse_spec(run.spec, source=f"gate {gate_id}")
    except GateError as exc:  # stored specs were validated; a schema change could break one
        _fail(factory, gate_id, "gate.invalid_spec", exc.message, settings.state_write_retry_s)
        _notify(factory, gate_id, settings, run.callback)
        return "error"
    wait = min(min_wait_s, settings.max_wait_s)
    if wait > spec.shape.wait_s:
        log.info("gate %s waits up to %.0f s for held GPUs (recovered)", gate_id, wait, extra=extra)
        spec = spec.model_copy(update={"shape": spec.shape.model_copy(update={"wait_s": wait})})
    runner = GateRunner(
        spec,
        settings,
        db_url=settings.resolved_database_url(),
        progress=LogProgress(gate_id),
        gate_id=gate_id,
        worker=worker,
        alive=None if liveness is None else (lambda: liveness.beat(gate_id, worker)),
    )
    try:
        outcome = asyncio.run(_run_registered(runner))
    except BaseException as exc:
        # The runner records every ending it knows; this is one it does not (a bug, or an
        # interrupt before its teardown could finish). Never leave the row running.
        log.exception("gate %s failed outside its runner", gate_id, extra=extra)
        _fail(
            factory,
            gate_id,
            "gate.internal_error",
            f"the gate failed on {worker}: {type(exc).__name__}: {exc}",
            settings.state_write_retry_s,
        )
        _notify(factory, gate_id, settings, run.callback)
        if isinstance(exc, Exception | asyncio.CancelledError):
            return "error"
        raise
    state = outcome.doc.state
    log.info(
        "gate %s finished: %s, verdict %s",
        gate_id,
        state,
        outcome.verdict,
        extra={**extra, "state": state, "verdict": outcome.verdict},
    )
    _notify(factory, gate_id, settings, run.callback)
    return state


def _notify(
    factory: sessionmaker[Session], gate_id: str, settings: Settings, callback: object
) -> None:
    """The gate's commit-status callback, if it has one, and its verdict alerts: owed until
    sent, so what fails here is retried by the reapers (gate.service.notify, .alerts)."""
    if callback:
        notify(factory, gate_id, settings)
    try:
        send_alerts(factory, gate_id, settings)
    except Exception:  # the reapers retry; a gate's ending never fails on its alerts
        log.exception("gate %s: alerts failed", gate_id, extra={"gate_id": gate_id})


def _fail(
    factory: sessionmaker[Session], gate_id: str, check: str, message: str, retry_s: float
) -> None:
    """End a gate that is still running (or pending) as an error with a hold, and release
    whatever reservation it still holds."""
    held = persist_sync(
        "the failed gate",
        lambda: service.fail_gate(factory, gate_id, check, message),
        retry_s,
        gate_id,
    )
    for reservation_id in held:
        leases.release(factory, reservation_id, "gate failed")
