"""`gate worker`: a Celery worker process that runs gates from the `gates` queue.

- Pool: `solo` at concurrency 1 (the gate runs in the main thread), `threads` above; each
  gate runs its own asyncio loop in its thread. Engines are children of this one process and
  are launched with a parent-death signal, so they die with it, however it dies.
- A reaper thread ends the gates whose worker was lost (any worker's, this one's included
  after a restart): every `GATE_HEARTBEAT_S` it ends running gates whose heartbeat is older
  than `GATE_LOST_AFTER_S` in hold, with the lost worker named, and releases their GPUs.
  Each pass that reached the database touches `alive_file()`, for a container health check.
- Warm shutdown (SIGTERM, or the first Ctrl-C): the worker takes no new gate, and every gate
  it is running is stopped at once: engines torn down, reservation released, the gate ended
  `cancelled` with verdict hold and the reason "worker ... shut down". Its message is then
  acknowledged. A gate already judging finishes first (its teardown is under way). Gates can
  run for many minutes and orchestrators follow SIGTERM with SIGKILL after a grace period,
  so waiting for them would only turn a clean hold into a lost worker.
- SIGKILL, a node loss, an OOM kill: nothing runs in this process any more; the engines die
  with it (parent-death signal), the gate's heartbeat stops and another worker's (or the
  API's) reaper ends it in hold within `GATE_LOST_AFTER_S` + `GATE_HEARTBEAT_S`, releasing its
  reservation; the GPU leases also expire on their own after `GATE_LEASE_TTL_S`. The
  unacknowledged message comes back after the visibility timeout and is skipped.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from gate.core.settings import Settings
from gate.engines.orphans import sweep_orphans
from gate.service.dispatch import end_dead_predecessors
from gate.service.execution import open_factory, running_gates, stop_running_gates, worker_name
from gate.service.process_marks import ProcessMark
from gate.service.reaper import Reaper
from gate.worker.broker_liveness import BrokerLiveness
from gate.worker.celery_app import QUEUE, make_celery
from gate.worker.celery_dispatch import CeleryDispatcher
from gate.worker.logs import configure_logging

log = logging.getLogger("gate.worker")

EXIT_CONFIG = 2


def run_worker(settings: Settings, concurrency: int = 1) -> int:
    """Run a Celery worker in this process until it is shut down; returns its exit code."""
    if not settings.broker_url:
        print(
            "gate: `gate worker` needs a broker: set GATE_BROKER_URL (e.g. redis://host:6379/0)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if concurrency < 1:
        print("gate: --concurrency must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging()
    sweep_orphans()  # engine processes a gate killed on this host left behind
    name = worker_name("worker")
    factory = open_factory(settings)
    app = make_celery(settings, factory)
    _connect_signals(settings, name, concurrency)

    # A previous worker of this data directory that died (SIGKILL, OOM) is proven dead by its
    # liveness mark: its gates end now, not GATE_LOST_AFTER_S later. Then our own mark, before
    # any claim (gate/service/process_marks.py).
    end_dead_predecessors(settings, factory, name)
    mark = ProcessMark(settings.data_dir, name)
    reaper = Reaper(
        settings,
        factory,
        alive_file=alive_file(settings),
        requeue=CeleryDispatcher(settings),
        liveness=BrokerLiveness(settings.broker_url, settings.lost_after_s),
    ).start()
    reaper.once()
    worker = app.Worker(
        hostname=f"gate-{os.getpid()}@{socket.gethostname()}",
        pool="solo" if concurrency == 1 else "threads",
        concurrency=concurrency,
        queues=[QUEUE],
        loglevel="INFO",
        quiet=True,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    )
    try:
        worker.start()
    finally:
        reaper.stop()
        mark.release()
    code = int(getattr(worker, "exitcode", 0) or 0)
    log.info("%s stopped (exit %d)", name, code, extra={"worker": name})
    return code


def _connect_signals(settings: Settings, name: str, concurrency: int) -> None:
    """Celery's signals: our logging kept, readiness logged, running gates stopped (engines
    torn down, GPUs released) at a shutdown."""
    from celery import signals

    def keep_our_logging(**_: Any) -> None:
        return None  # a receiver here stops Celery from configuring logging itself

    def on_ready(**_: Any) -> None:
        log.info(
            "%s ready: queue %s, %d gate(s) at a time, broker %s, database %s",
            name,
            QUEUE,
            concurrency,
            _redacted(settings.broker_url or ""),
            _redacted(settings.resolved_database_url()),
            extra={"worker": name},
        )

    def on_shutdown(sig: str = "SIGTERM", how: str = "Warm", **_: Any) -> None:
        gates = running_gates()
        if how != "Warm" and not gates:
            return
        reason = (
            f"the worker running this gate ({name}) was shut down ({sig}) before the gate "
            "could decide; its engines were torn down and its GPUs released"
        )
        stopped = stop_running_gates(reason)
        log.warning(
            "%s: %s shutdown (%s); stopping %d running gate(s): %s",
            name,
            how.lower(),
            sig,
            len(stopped),
            ", ".join(stopped) or "none",
            extra={"worker": name},
        )

    signals.setup_logging.connect(keep_our_logging, weak=False)
    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutting_down.connect(on_shutdown, weak=False)


def alive_file(settings: Settings) -> Path:
    """Touched by the worker's reaper after every pass that reached the database (every
    `GATE_HEARTBEAT_S`, also while a gate runs): the container health check reads its age.
    Named after the host, so workers sharing a data volume keep one file each."""
    return settings.data_dir / "workers" / f"{socket.gethostname()}.alive"


def _redacted(url: str) -> str:
    """A URL without its password, for logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@", 1)[-1]
