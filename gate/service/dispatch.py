"""Where gate runs execute: threads of this process (the embedded default) or Celery workers
(when `GATE_BROKER_URL` is set; `gate.worker.celery_dispatch`, which builds the one to use).
Both run `execute_gate`, and both keep a reaper going (gate/service/reaper.py)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from gate.core.settings import Settings
from gate.service import service
from gate.service.execution import execute_gate, recovery_wait_s, worker_name
from gate.service.process_marks import ProcessMark, dead_workers

log = logging.getLogger("gate.runs")


class Dispatcher(Protocol):
    kind: str

    def submit(self, gate_id: str) -> None: ...

    def queue_depth(self) -> int | None: ...

    def close(self) -> None: ...


class InProcessDispatcher:
    """Gate runs on a small thread pool inside the API process; nothing else to start. On
    shutdown the running gates are cancelled and waited for, so their engines are torn down
    and their GPUs released before the process exits."""

    kind = "in-process"

    def __init__(
        self, settings: Settings, factory: sessionmaker[Session], max_gates: int = 2
    ) -> None:
        self.settings = settings
        self.factory = factory
        self.pool = ThreadPoolExecutor(max_workers=max_gates, thread_name_prefix="gate")
        self.worker = worker_name("api")
        self._pending = 0
        self._running: set[str] = set()
        self._recovered: set[str] = set()  # pending at the previous process's end
        self._lock = threading.Lock()
        self._closing = False
        self._mark: ProcessMark | None = None

    def _marked(self) -> None:
        """Hold this process's liveness mark before it claims any gate (process_marks.py)."""
        with self._lock:
            if self._mark is None:
                self._mark = ProcessMark(self.settings.data_dir, self.worker)

    def submit(self, gate_id: str) -> None:
        self._marked()
        with self._lock:
            if self._closing:
                return  # it stays pending; the next start of the service picks it up
            self._pending += 1
        self.pool.submit(self._run, gate_id)

    def _run(self, gate_id: str) -> None:
        with self._lock:
            self._pending -= 1
            if self._closing:
                return
            self._running.add(gate_id)
        try:
            recovered = gate_id in self._recovered
            wait = recovery_wait_s(self.settings) if recovered else 0.0
            execute_gate(gate_id, self.settings, self.worker, self.factory, min_wait_s=wait)
        except Exception:
            log.exception("gate %s failed outside the runner", gate_id, extra={"gate_id": gate_id})
        finally:
            with self._lock:
                self._running.discard(gate_id)

    def queue_depth(self) -> int | None:
        return self._pending

    def resubmit_pending(self) -> int:
        """After a restart: end the gates of the previous process if it is proven dead (its
        GPUs are free at once, not GATE_LOST_AFTER_S later), then queue every gate still
        pending (their submissions died with it). A resubmitted gate waits for held GPUs at
        least as long as a lost gate takes to be reaped (`recovery_wait_s`): the ones the
        dead process held but this one cannot prove dead (another host's, say) are freed
        by a reaper, never failed on as `lease_conflict`."""
        end_dead_predecessors(self.settings, self.factory, self.worker)
        ids = service.pending_gate_ids(self.factory)
        with self._lock:
            self._recovered.update(ids)
        for gid in ids:
            self.submit(gid)
        return len(ids)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            running = list(self._running)
        for gid in running:
            try:
                service.request_cancel(
                    self.factory,
                    gid,
                    f"the service ({self.worker}) was stopped before the gate could decide",
                    admin=True,  # the service itself
                )
            except Exception:  # it finished meanwhile
                log.debug("gate %s finished before the shutdown cancel", gid)
            else:
                log.warning("service stopping: gate %s cancelled", gid, extra={"gate_id": gid})
        self.pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            mark, self._mark = self._mark, None
        if mark is not None:
            mark.release()


def end_dead_predecessors(settings: Settings, factory: sessionmaker[Session], me: str) -> list[str]:
    """At a start, before this process claims anything: end the running gates whose worker
    is proven dead by its liveness mark in GATE_DATA_DIR (a previous `gate serve` or `gate
    worker` here, SIGKILLed; `gate.service.process_marks`), their GPUs released. Others are left to
    the reapers' heartbeat rule."""
    try:
        dead = dead_workers(settings.data_dir, service.running_workers(factory))
        ended = service.end_dead_workers(factory, dead, me)
    except Exception:
        log.exception("ending the gates of dead predecessors failed; the reapers will")
        return []
    for gid in ended:
        log.warning(
            "gate %s: its worker died before this process started: ended in hold",
            gid,
            extra={"gate_id": gid},
        )
    return ended
