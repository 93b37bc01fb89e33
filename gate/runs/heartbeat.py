"""How a running gate stays alive and is stopped: its heartbeat (on a thread of its own, so it
beats while the event loop is busy), a cancel request read from the gate row, the gate's
deadline, and a worker shutting down. Exactly one of them stops a run; the first wins. (How a
process that runs gates marks itself alive for its successor is the service's:
gate/service/process_marks.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gate.core.errors import DeadlinePassed, GateCancelled, GateError, LeaseLost
from gate.core.vocabulary import FinishedState
from gate.runs import rows
from gate.runs.context import RunContext

_T = TypeVar("_T")
log = logging.getLogger("gate.runs")


class Stops:
    """Why the run was stopped from outside its own flow, and by whom: a cancel (the API, a
    worker shutting down) or the deadline, set once under one lock."""

    def __init__(self) -> None:
        self.cancel_reason: str | None = None
        self.deadline_reason: str | None = None
        self.lease_reason: str | None = None
        self._lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        return (self.cancel_reason or self.deadline_reason or self.lease_reason) is not None

    def cancel(self, reason: str) -> bool:
        """Record a cancel; False when the run was already being stopped."""
        with self._lock:
            if self.stopped:
                return False
            self.cancel_reason = reason
            return True

    def deadline(self, reason: str) -> bool:
        with self._lock:
            if self.stopped:
                return False
            self.deadline_reason = reason
            return True

    def lease_lost(self, reason: str) -> bool:
        with self._lock:
            if self.stopped:
                return False
            self.lease_reason = reason
            return True

    def error(self) -> tuple[GateError, FinishedState]:
        """The error and state a stopped run ends with."""
        if self.lease_reason is not None:
            return LeaseLost(self.lease_reason), "error"
        if self.deadline_reason is not None and self.cancel_reason is None:
            return DeadlinePassed(self.deadline_reason), "error"
        why = self.cancel_reason or "the gate was interrupted before it could decide"
        return GateCancelled(why), "cancelled"


class Heartbeat:
    """The gate's own heartbeat thread: it proves the worker process is alive (a gate whose
    heartbeat stops is ended by the reaper), publishes progress, and obeys a cancel request
    by cancelling the run on its loop."""

    def __init__(
        self,
        ctx: RunContext,
        stops: Stops,
        main: asyncio.Task[Any] | None,
        alive: Callable[[], None] | None = None,
    ) -> None:
        self.ctx, self.stops, self.main = ctx, stops, main
        self.alive = alive
        self.loop = asyncio.get_running_loop()
        self._down_since: float | None = None
        self._failures = 0
        self._obey = True
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"gate-heartbeat-{ctx.gate_id[:8]}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _recovered(self, down_s: float) -> None:
        """Say what happened, once the database is back: a log line, a phase row and a note
        on the verdict document."""
        what = (
            f"The gate could not write to its database for {down_s:.0f} s "
            f"({self._failures} failed heartbeats); it ran on, and wrote its state when the "
            "database was back."
        )
        log.warning("gate %s: %s", self.ctx.gate_id, what)
        self.ctx.journal.record(("gate", "database_back", self.ctx.clock.now_s(), what))
        self.ctx.notes.append(what)
        self._failures = 0

    def _failed(self, exc: Exception) -> None:
        first = self._down_since is None
        if first:
            self._down_since = time.monotonic()
        down = time.monotonic() - (self._down_since or 0.0)
        self._failures += 1
        if first or self._failures % 10 == 0:  # the first, then every tenth
            log.warning(
                "gate %s: writing the heartbeat failed (%s: %s), %.0f s without the database; "
                "the gate runs on and retries",
                self.ctx.gate_id,
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
                down,
            )

    def quiet(self) -> None:
        """Obey no more cancel requests (the run is tearing down), but beat on until `join`:
        the gate is alive through its teardown and its final write."""
        self._obey = False

    async def join(self) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.ctx.settings.heartbeat_s):
            if self.alive is not None:
                # The broker's copy: the reaper's proof of life when the database cannot be
                # written (gate/worker/broker_liveness.py). Its failures are its own to log.
                with contextlib.suppress(Exception):
                    self.alive()
            try:
                state = dict(self.ctx.progress.state)
                cancel = rows.beat(self.ctx.factory, self.ctx.gate_id, state)
            except Exception as exc:  # an outage must not kill the run; the next beat retries
                self._failed(exc)
                continue
            if self._down_since is not None:
                self._recovered(time.monotonic() - self._down_since)
                self._down_since = None
            if cancel is None or not self._obey or self.main is None:
                continue  # beat on: through teardown and the final write too
            if self.stops.cancel(cancel):  # False: something else is stopping it already
                self.loop.call_soon_threadsafe(self.main.cancel)
            self._obey = False


async def in_daemon_thread(fn: Callable[[], _T], name: str) -> _T:
    """`fn()` on a thread of its own, awaited without blocking the event loop.

    Not `asyncio.to_thread`: a cancelled await leaves a to_thread call running in the loop's
    default executor, which `asyncio.run` joins at its end, so a gate cancelled while judging
    would still hold its process until the judge finished. A daemon thread is abandoned
    instead: the cancel ends the gate at once (teardown, release), and its result, if it ever
    comes, is dropped."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, exc: BaseException | None) -> None:
        if done.done():
            return  # cancelled meanwhile
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, exc = fn(), None
        except BaseException as e:  # handed to the awaiting task
            result, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await done
