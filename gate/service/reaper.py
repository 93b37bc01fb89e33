"""The reapers: a daemon thread in the API and in every `gate worker` that makes sure no gate
is lost or stuck (see `Reaper`). Any number may run at once; each of their steps is claimed
in the database, so none is done twice."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from gate.core.errors import DatabaseWaited
from gate.core.settings import Settings
from gate.engines.orphans import sweep_orphans
from gate.service import service
from gate.service.alerts import alerts_due
from gate.service.execution import running_gates
from gate.service.notify import notify_due
from gate.service.sweep import sweep_lost_gates

log = logging.getLogger("gate.runs")


KUBE_SWEEP_S = 60.0


class Requeue(Protocol):
    def queued_ids(self) -> set[str] | None: ...

    def submit(self, gate_id: str) -> None: ...


class Liveness(Protocol):
    def alive_ids(self) -> set[str] | None: ...


class Reaper:
    """A daemon thread that, every heartbeat period, makes sure no gate is lost or stuck:

    - ends the running gates whose worker stopped heartbeating (hold, reservation released);
    - with a broker (`requeue`), queues again the gates pending longer than
      `requeue_after_s` whose task the broker does not hold (the API died between storing
      and queueing one, or the broker lost it); a task id per gate keeps this at most one
      extra delivery, which the claim turns into a no-op if the first one shows up;
    - delivers the commit-status callbacks still owed (`gate.service.notify`) and the verdict
      alerts (`gate.service.alerts`);
    - every `KUBE_SWEEP_S`, deletes the expired Leases of recently lost Kubernetes gates, so
      their pods go without waiting for the next gate in that namespace (`gate.service.sweep`).

    Idempotent: any number of reapers may run (each lost gate is ended once: the pass locks
    the rows it ends and skips the ones another reaper holds; callback attempts are claimed).
    The API and every `gate worker` run one, so all this happens as long as any of them is
    up. With `alive_file`, every pass that reached the database touches that file: a
    container health check reads its age."""

    def __init__(
        self,
        settings: Settings,
        factory: sessionmaker[Session],
        *,
        alive_file: Path | None = None,
        requeue: Requeue | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        self.settings = settings
        self.factory = factory
        self.alive_file = alive_file
        self.requeue = requeue
        self.liveness = liveness
        self.spared: list[str] = []  # the last pass's stale gates known alive
        self._db_ok_since: float | None = None  # monotonic: the database's last failure
        self._next_sweep = 0.0  # monotonic; the first pass sweeps
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gate-reaper", daemon=True)

    def start(self) -> Reaper:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            self.once()

    def _spare(self) -> set[str] | None:
        """Gates known alive whatever their database heartbeat says: the ones this process
        runs, and those the broker holds a proof of life for; None when the broker cannot
        be read (then no heartbeat proves a death)."""
        spare = set(running_gates())
        if self.liveness is not None:
            alive = self.liveness.alive_ids()
            if alive is None:
                return None
            spare |= alive
        return spare

    def _may_reap(self) -> bool:
        """Not until the database has answered for GATE_LOST_AFTER_S since this reaper last
        saw it fail or stall: heartbeats need that long to be written again after an
        outage everyone shared."""
        ok = self._db_ok_since
        return ok is None or time.monotonic() - ok >= self.settings.lost_after_s

    def once(self) -> list[str]:
        spare = self._spare()
        try:
            if spare is None:
                log.warning("the broker cannot be read: no gate is ended as lost this pass")
                ended: list[str] = []
            elif not self._may_reap():
                ended = []
            else:
                self.spared = []
                ended = service.reap_lost(
                    self.factory,
                    self.settings.lost_after_s,
                    spare=spare,
                    broker=self.liveness is not None,
                    spared=self.spared,
                    max_wait_s=max(1.0, self.settings.heartbeat_s),
                )
                for gid in self.spared:
                    log.warning(
                        "gate %s: no database heartbeat for over %g s, but its worker is alive "
                        "(this process, or the broker): not ended",
                        gid,
                        self.settings.lost_after_s,
                        extra={"gate_id": gid},
                    )
        except DatabaseWaited as exc:
            log.warning("reaper pass %s: no gate ended; reaping resumes after a quiet spell", exc)
            self._db_ok_since = time.monotonic()
            return []
        except Exception:
            log.exception("reaper pass failed")
            self._db_ok_since = time.monotonic()  # counted from now, and again at each failure
            return []
        if self.alive_file is not None:
            try:
                self.alive_file.parent.mkdir(parents=True, exist_ok=True)
                self.alive_file.touch()
            except OSError:
                log.warning("cannot touch %s", self.alive_file)
        for gid in ended:
            log.warning("gate %s lost its worker: ended in hold", gid, extra={"gate_id": gid})
        self.requeue_stuck()
        try:
            notify_due(self.factory, self.settings)
            alerts_due(self.factory, self.settings)
        except Exception:
            log.exception("callback or alert pass failed")
        if ended or time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + KUBE_SWEEP_S
            try:
                sweep_lost_gates(self.factory)
            except Exception:
                log.exception("cluster sweep failed")
            sweep_orphans()  # engine processes of gates that died on this host
        return ended

    def requeue_stuck(self) -> list[str]:
        """Queue again the pending gates the broker has lost track of (see the class)."""
        if self.requeue is None:
            return []
        try:
            stale = service.stale_pending(self.factory, self.settings.requeue_after_s)
        except Exception:
            log.exception("requeue pass failed")
            return []
        if not stale:
            return []
        held = self.requeue.queued_ids()
        if held is None:
            return []  # cannot tell what the broker holds; queueing blind would pile up
        sent: list[str] = []
        for gid in stale:
            if gid in held:
                continue
            try:
                self.requeue.submit(gid)
            except Exception:
                log.exception("gate %s: requeue failed", gid, extra={"gate_id": gid})
                continue
            log.warning(
                "gate %s was pending with no task in the broker: queued again",
                gid,
                extra={"gate_id": gid},
            )
            sent.append(gid)
        return sent

    def stop(self) -> None:
        self._stop.set()
