"""Where gate runs execute: threads of this process (the embedded default) or Celery workers
(when `GATE_BROKER_URL` is set). Both run `execute_gate`, and both keep a reaper going that
ends the gates whose worker was lost."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import transaction
from gate.core.settings import Settings
from gate.models import GateRun
from gate.runs import store
from gate.runs.execute import execute_gate, worker_name

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
        self._lock = threading.Lock()
        self._closing = False

    def submit(self, gate_id: str) -> None:
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
            execute_gate(gate_id, self.settings, self.worker, self.factory)
        except Exception:
            log.exception("gate %s failed outside the runner", gate_id, extra={"gate_id": gate_id})
        finally:
            with self._lock:
                self._running.discard(gate_id)

    def queue_depth(self) -> int | None:
        return self._pending

    def resubmit_pending(self) -> int:
        """After a restart: queue every gate still pending (their submissions died with the
        previous process)."""
        with transaction(self.factory) as s:
            ids = list(s.scalars(select(GateRun.id).where(GateRun.state == "pending")))
        for gid in ids:
            self.submit(gid)
        return len(ids)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            running = list(self._running)
        for gid in running:
            try:
                store.request_cancel(
                    self.factory,
                    gid,
                    f"the service ({self.worker}) was stopped before the gate could decide",
                )
            except Exception:  # it finished meanwhile
                log.debug("gate %s finished before the shutdown cancel", gid)
            else:
                log.warning("service stopping: gate %s cancelled", gid, extra={"gate_id": gid})
        self.pool.shutdown(wait=True, cancel_futures=True)


class CeleryDispatcher:
    """Gate runs as Celery tasks on `gate worker` processes. Call `submit` only after the
    transaction that created the gate row committed: a worker may claim it at once. The task
    id is `gate-<id>`, so a gate submitted twice is two deliveries of one task, and the
    second is skipped by the worker that receives it."""

    kind = "celery"

    def __init__(self, settings: Settings) -> None:
        from gate.worker.celery_app import QUEUE, TASK_NAME, make_celery

        self.app = make_celery(settings)
        self.queue = QUEUE
        self.task_name = TASK_NAME

    def submit(self, gate_id: str) -> None:
        self.app.send_task(
            self.task_name, args=[gate_id], task_id=f"gate-{gate_id}", queue=self.queue
        )
        log.info("gate %s queued on %s", gate_id, self.queue, extra={"gate_id": gate_id})

    def queue_depth(self) -> int | None:
        """Gate tasks waiting in the queue (not the ones workers are running)."""
        try:
            with self.app.connection_for_write() as conn:
                return int(conn.default_channel.client.llen(self.queue))
        except Exception:
            return None

    def close(self) -> None:
        self.app.close()


def make_dispatcher(settings: Settings, factory: sessionmaker[Session]) -> Dispatcher:
    if settings.broker_url:
        return CeleryDispatcher(settings)
    return InProcessDispatcher(settings, factory, max_gates=settings.local_gates)


class Reaper:
    """A daemon thread ending lost gates every heartbeat period (idempotent: any number of
    reapers may run, each lost gate is ended once: the pass locks the rows it ends and skips
    the ones another reaper holds). The API and every `gate worker` run one, so a gate whose
    worker died is ended as long as any of them is up. With `alive_file`, every pass that
    reached the database touches that file: a container health check reads its age."""

    def __init__(
        self,
        settings: Settings,
        factory: sessionmaker[Session],
        *,
        alive_file: Path | None = None,
    ) -> None:
        self.settings = settings
        self.factory = factory
        self.alive_file = alive_file
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gate-reaper", daemon=True)

    def start(self) -> Reaper:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            self.once()

    def once(self) -> list[str]:
        try:
            ended = store.reap_lost(self.factory, self.settings.lost_after_s)
        except Exception:
            log.exception("reaper pass failed")
            return []
        if self.alive_file is not None:
            try:
                self.alive_file.parent.mkdir(parents=True, exist_ok=True)
                self.alive_file.touch()
            except OSError:
                log.warning("cannot touch %s", self.alive_file)
        for gid in ended:
            log.warning("gate %s lost its worker: ended in hold", gid, extra={"gate_id": gid})
        return ended

    def stop(self) -> None:
        self._stop.set()
