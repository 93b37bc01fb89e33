"""The Celery application: gate runs as tasks on `gate worker` processes.

The database is the source of truth, so there is no result backend: the task is a thin
wrapper that claims the stored gate and runs it (`gate.service.execution.execute_gate`).

Delivery guarantees, and why each setting is what it is:

- `acks_late`: the message is acknowledged when the gate has ended, not when it was
  received; a worker that dies mid-gate leaves it unacknowledged, and Redis hands it out
  again after `visibility_timeout` (`GATE_BROKER_VISIBILITY_TIMEOUT_S`).
- Redelivery is harmless: `gate.service.service.claim` moves a gate from pending to running with a
  conditional update, so a second delivery of a claimed, finished or cancelled gate does
  nothing (`skipped`). A gate whose worker died after claiming it is ended by the reaper
  (heartbeat older than `GATE_LOST_AFTER_S`), not rerun: its evidence died with the engines.
  A gate whose worker died before claiming it is still pending and runs on the redelivery.
- `visibility_timeout` therefore only bounds how long such a pending gate waits; it need not
  exceed the longest gate (a redelivery of a running gate is a no-op, acknowledged at once).
  Workers sweep for expired unacknowledged messages every `visibility_timeout / 4` seconds,
  at most every 10 s, and once at start.
- `worker_prefetch_multiplier=1` with late acks: a worker holds only the gates it runs.
- `reject_on_worker_lost`: should a pool child die (not the pools `gate worker` uses, but
  any pool), the message is requeued rather than acknowledged.
- `acks_on_failure_or_timeout`: a task that failed is acknowledged (a failure after the claim
  is recorded on the gate; redelivering it would only be skipped). A database that cannot be
  reached before the claim is retried with backoff instead, and a gate received by a worker
  that is shutting down is rejected back onto the queue, unclaimed.
- JSON only: the message is `["<gate id>"]`; nothing is unpickled.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gate.core.errors import WorkerStopping
from gate.core.settings import Settings
from gate.service.execution import execute_gate, open_factory, worker_name
from gate.worker.broker_liveness import BrokerLiveness

log = logging.getLogger("gate.worker")

TASK_NAME = "gate.run"
QUEUE = "gates"
RETRY_BACKOFF_MAX_S = 60
RETRY_MAX = 30  # with backoff capped at 60 s: about half an hour of an unreachable database


def celery_config(settings: Settings) -> dict[str, Any]:
    vt = settings.broker_visibility_timeout_s
    return {
        "broker_url": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": vt,
            "unacked_restore_interval": max(1.0, min(10.0, vt / 4)),
            "unacked_restore_throttle": 1,
        },
        "task_default_queue": QUEUE,
        "task_routes": {TASK_NAME: {"queue": QUEUE}},
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        # A broker blip must not cancel running gates; their messages are redelivered (a
        # no-op) if the acknowledgement is lost.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "enable_utc": True,
    }


class _Factory:
    """The worker's sessionmaker, opened (and the schema migrated) on first use."""

    def __init__(self, settings: Settings, factory: sessionmaker[Session] | None) -> None:
        self.settings = settings
        self._factory = factory
        self._lock = threading.Lock()

    def get(self) -> sessionmaker[Session]:
        with self._lock:
            if self._factory is None:
                self._factory = open_factory(self.settings)
            return self._factory


class _Liveness:
    """The broker's proof-of-life client, made on first use (the API only sends tasks)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: BrokerLiveness | None = None
        self._lock = threading.Lock()

    def get(self) -> BrokerLiveness | None:
        if not self.settings.broker_url:
            return None
        with self._lock:
            if self._client is None:
                self._client = BrokerLiveness(self.settings.broker_url, self.settings.lost_after_s)
            return self._client


def make_celery(settings: Settings, factory: sessionmaker[Session] | None = None) -> Any:
    """The Celery app for `settings` (broker `GATE_BROKER_URL`), with the `gate.run` task.
    The API uses it only to send tasks; `gate worker` runs them."""
    from celery import Celery

    app = Celery("gate", set_as_current=False)
    app.conf.update(celery_config(settings))
    db = _Factory(settings, factory)
    liveness = _Liveness(settings)

    def run_gate_task(task: Any, gate_id: str) -> str:
        """Claim and run one stored gate; `skipped` when another delivery already did."""
        try:
            return execute_gate(gate_id, settings, worker_name("worker"), db.get(), liveness.get())
        except WorkerStopping as exc:
            from celery.exceptions import Reject

            log.info("%s: requeued", exc.message, extra={"gate_id": gate_id})
            raise Reject(exc.message, requeue=True) from exc
        except (OperationalError, DBAPIError) as exc:
            if not exc.connection_invalidated and not isinstance(exc, OperationalError):
                raise
            log.warning(
                "gate %s: database unreachable (%s); retrying",
                gate_id,
                type(exc).__name__,
                extra={"gate_id": gate_id},
            )
            retries = int(task.request.retries)
            countdown = min(RETRY_BACKOFF_MAX_S, 2**retries)
            raise task.retry(exc=exc, countdown=countdown, max_retries=RETRY_MAX) from exc

    # `shared=False`: the task belongs to this app alone. Celery's default (shared) also
    # registers it on every app finalized afterwards, so the second app of one process (the
    # worker's own and its reaper's CeleryDispatcher) met two `gate.run` callables and printed
    # a DuplicateTaskNameWarning at every `gate worker` start. No `queue=` either: a task's
    # queue attribute is deprecated (Celery 6 ignores it); `task_routes` sends it to QUEUE.
    app.task(
        name=TASK_NAME,
        shared=False,
        bind=True,
        acks_late=True,
        reject_on_worker_lost=True,
        acks_on_failure_or_timeout=True,
        ignore_result=True,
    )(run_gate_task)
    return app
