"""Writes of a running gate's state that must not be lost, and must not stop the gate, when the
database is unreachable for a while: every failure is logged and retried with backoff.

`PhaseJournal` takes the gate's phase rows off the event loop: a phase is recorded in memory at
once and written, in order, by a thread of its own, so a database that is locked or restarting
never blocks the run (its crash watch, its lease renewal, its teardown). `persist` retries one
write (the finished record, the release of the GPUs) until it lands or its budget is spent.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from gate.core.errors import transient

log = logging.getLogger("gate.runs")

_T = TypeVar("_T")
MAX_RETRY_DELAY_S = 15.0
ROW_RETRY_S = 3600.0  # a phase row is retried this long before it is given up (and logged)
PhaseRow = tuple[str, str, float, str | None]  # role, phase, at_s, detail


def persist_sync(what: str, write: Callable[[], _T], budget_s: float, gate_id: str = "") -> _T:
    """`write()` until it succeeds, logging each failure, for at most `budget_s`; the last
    failure is raised, and a failure that is not transient at once."""
    deadline = time.monotonic() + budget_s
    delay, failures = 0.5, 0
    while True:
        try:
            out = write()
        except Exception as exc:
            if not transient(exc):
                raise
            failures += 1
            left = deadline - time.monotonic()
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            log.warning(
                "gate %s: writing %s failed (%s: %s), try %d; %s",
                gate_id,
                what,
                type(exc).__name__,
                first,
                failures,
                f"retrying in {min(delay, max(left, 0)):.1f} s" if left > 0 else "giving up",
            )
            if left <= 0:
                raise
            time.sleep(min(delay, left))
            delay = min(delay * 2, MAX_RETRY_DELAY_S)
            continue
        if failures:
            log.warning("gate %s: wrote %s after %d failed tries", gate_id, what, failures)
        return out


async def persist(what: str, write: Callable[[], _T], budget_s: float, gate_id: str = "") -> _T:
    """`persist_sync` on a worker thread."""
    return await asyncio.to_thread(persist_sync, what, write, budget_s, gate_id)


class PhaseJournal:
    """Phase rows written in order by a thread of their own, retried while the database is
    unreachable. `flush` waits until every row recorded so far is written (or its budget
    passes: the rows left are logged, not silently dropped)."""

    def __init__(self, write: Callable[[PhaseRow], None], gate_id: str) -> None:
        self._write = write
        self.gate_id = gate_id
        self._queue: queue.Queue[PhaseRow | None] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name=f"gate-phases-{gate_id[:8]}", daemon=True
        )
        self._thread.start()

    def record(self, row: PhaseRow) -> None:
        with self._lock:
            self._pending += 1
            self._idle.clear()
        self._queue.put(row)

    def _run(self) -> None:
        while (row := self._queue.get()) is not None:
            self._write_one(row)
            with self._lock:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.set()

    def _write_one(self, row: PhaseRow) -> None:
        def write() -> None:
            self._write(row)

        try:
            persist_sync(f"phase {row[0]}:{row[1]}", write, ROW_RETRY_S, self.gate_id)
        except Exception:  # that long without a database: the row is logged, not kept
            log.error("gate %s: phase %s:%s was not written: %s", self.gate_id, *row[:2], row)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every recorded row is written; False when `timeout_s` passed first."""
        done = self._idle.wait(timeout_s)
        if not done:
            log.error("gate %s: %d phase rows still unwritten", self.gate_id, self._pending)
        return done

    def close(self) -> None:
        self._queue.put(None)
