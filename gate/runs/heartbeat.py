"""How a running gate stays alive and is stopped: its heartbeat (on a thread of its own, so it
beats while the event loop is busy), a cancel request read from the gate row, the gate's
deadline, and a worker shutting down. Exactly one of them stops a run; the first wins. And how
a process that runs gates marks itself alive, so that its successor can prove it dead (the
last section)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from gate.core.errors import DeadlinePassed, GateCancelled, GateError, LeaseLost
from gate.core.vocabulary import FinishedState
from gate.runs import store
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
                # written (gate/worker/liveness.py). Its failures are its own to log.
                with contextlib.suppress(Exception):
                    self.alive()
            try:
                state = dict(self.ctx.progress.state)
                cancel = store.beat(self.ctx.factory, self.ctx.gate_id, state)
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


# -- a process's mark, so that its successor knows it died ------------------------------------
#
# A running gate's row names its worker process (`api@host:pid`, `worker@host:pid`). When that
# process is SIGKILLed, the row stays `running` until a reaper sees its heartbeat GATE_LOST_AFTER_S
# old (30 s by default), and its GPUs stay reserved that long: a gate pending at the crash,
# resubmitted at the restart, failed at once with `lease_conflict` against them. A process that
# runs gates therefore holds an exclusive lock (flock) on a file named after it in
# `GATE_DATA_DIR/workers/`, for as long as it lives. The kernel drops the lock when the process
# dies, however it dies, so a successor sharing the data directory (a restarted `gate serve` or
# `gate worker`, same host or same volume) proves a predecessor dead by taking its lock, and
# ends its gates at once. A name with no lock file here (another host, another data directory)
# proves nothing: the reapers' heartbeat rule covers it. Not a pid check: a container's restarted
# process often has its predecessor's pid (1), and another pid namespace can show a live
# process's pid as free.

LOCK_DIR = "workers"


def _lock_path(data_dir: Path, worker: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", worker)[:120]
    digest = hashlib.sha256(worker.encode()).hexdigest()[:12]  # two names never share a file
    return data_dir / LOCK_DIR / f"{safe}.{digest}.lock"


class ProcessMark:
    """This process's lock (see above), held until `release` or the process's death. `held`
    is False when it could not be taken (then this process's death is left to the reapers)."""

    WAIT_S = 5.0  # a successor testing a predecessor of our very name holds it an instant

    def __init__(self, data_dir: Path, worker: str) -> None:
        self.worker = worker
        self.path = _lock_path(data_dir, worker)
        self._fd: int | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = self._take()
        except OSError as exc:
            log.warning("%s: no liveness mark in %s (%s)", worker, self.path.parent, exc)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _take(self) -> int | None:
        deadline = time.monotonic() + self.WAIT_S
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() > deadline:
                    log.warning("%s: its liveness mark is held by another process", self.worker)
                    return None
                time.sleep(0.05)
                continue
            except OSError:
                os.close(fd)
                raise
            try:
                if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                    os.close(fd)  # a successor removed that file as we opened it: again
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, self.worker.encode())
            return fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(fd)


def dead_workers(data_dir: Path, workers: Iterable[str]) -> list[str]:
    """The workers among `workers` proven dead: their lock file is here and nobody holds its
    lock. Each proven dead has its file removed (it never comes back under that name but as a
    new process, which makes its own)."""
    dead = []
    for worker in workers:
        path = _lock_path(data_dir, worker)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue  # no mark here: not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: alive
        try:
            if os.read(fd, 4096).decode(errors="replace") == worker:
                dead.append(worker)
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)  # closing drops the lock
    return dead
