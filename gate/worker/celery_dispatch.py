"""The Celery side of dispatching: tasks sent to `gate worker` processes, and the choice
between them and the embedded thread pool (`gate.service.dispatch`).

It lives with the worker, above `gate.runs`: the task it sends is the worker's (`celery_app`),
and `gate.runs` must not know about Celery.
"""

from __future__ import annotations

import json
import logging

from sqlalchemy.orm import Session, sessionmaker

from gate.core.settings import Settings
from gate.service.dispatch import Dispatcher, InProcessDispatcher
from gate.worker.celery_app import QUEUE, TASK_NAME, make_celery

log = logging.getLogger("gate.worker")


class CeleryDispatcher:
    """Gate runs as Celery tasks on `gate worker` processes. Call `submit` only after the
    transaction that created the gate row committed: a worker may claim it at once. The task
    id is `gate-<id>`, so a gate submitted twice is two deliveries of one task, and the
    second is skipped by the worker that receives it."""

    kind = "celery"

    def __init__(self, settings: Settings) -> None:
        self.app = make_celery(settings)
        self.queue = QUEUE
        self.task_name = TASK_NAME

    def submit(self, gate_id: str) -> None:
        self.app.send_task(
            self.task_name, args=[gate_id], task_id=f"gate-{gate_id}", queue=self.queue
        )
        log.info("gate %s queued on %s", gate_id, self.queue, extra={"gate_id": gate_id})

    def queued_ids(self) -> set[str] | None:
        """The gates whose task the broker holds now: waiting in the queue, or delivered to a
        worker and not yet acknowledged (kombu's Redis transport keeps those in its `unacked`
        hash). None when the broker cannot be read."""
        try:
            with self.app.connection_for_write() as conn:
                channel = conn.default_channel
                client = channel.client
                raw = list(client.lrange(self.queue, 0, -1))
                raw += list(client.hvals(channel.unacked_key))
        except Exception:
            log.warning("cannot read the broker's queue", exc_info=True)
            return None
        ids: set[str] = set()
        for item in raw:
            task_id = _task_id(item)
            if task_id is not None and task_id.startswith("gate-"):
                ids.add(task_id.removeprefix("gate-"))
        return ids

    def queue_depth(self) -> int | None:
        """Gate tasks waiting in the queue (not the ones workers are running)."""
        try:
            with self.app.connection_for_write() as conn:
                return int(conn.default_channel.client.llen(self.queue))
        except Exception:
            return None

    def close(self) -> None:
        self.app.close()


def _task_id(raw: bytes | str) -> str | None:
    """The task id of one kombu message as Redis stores it: the message JSON, or (in the
    unacked hash) `[message, exchange, routing_key]`."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if isinstance(doc, list) and doc:
        doc = doc[0]
        if isinstance(doc, str | bytes):
            try:
                doc = json.loads(doc)
            except ValueError:
                return None
    if not isinstance(doc, dict):
        return None
    headers = doc.get("headers")
    if isinstance(headers, dict) and isinstance(headers.get("id"), str):
        return str(headers["id"])
    props = doc.get("properties")
    if isinstance(props, dict) and isinstance(props.get("correlation_id"), str):
        return str(props["correlation_id"])
    return None


def make_dispatcher(settings: Settings, factory: sessionmaker[Session]) -> Dispatcher:
    if settings.broker_url:
        return CeleryDispatcher(settings)
    return InProcessDispatcher(settings, factory, max_gates=settings.local_gates)
