"""Run one stored gate to its end, wherever it is executed (an in-process thread of the API
or a Celery worker): claim it, run it, notify its callback. Idempotent: a second delivery of
the same gate finds it claimed or finished and does nothing."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import make_engine, make_sessionmaker, transaction, upgrade
from gate.core.errors import GateError
from gate.core.settings import Settings
from gate.models import GateRun
from gate.runs import store
from gate.runs.progress import NullProgress
from gate.runs.service import run_gate
from gate.spec import parse_spec

log = logging.getLogger("gate.runs")


def worker_name(kind: str) -> str:
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


def open_factory(settings: Settings) -> sessionmaker[Session]:
    engine = make_engine(settings.resolved_database_url())
    upgrade(engine)
    return make_sessionmaker(engine)


def execute_gate(
    gate_id: str, settings: Settings, worker: str, factory: sessionmaker[Session] | None = None
) -> str:
    """Run the stored gate `gate_id`; returns what happened: its final state, or `skipped`
    when it was not pending (already run, running elsewhere, or cancelled)."""
    factory = factory or open_factory(settings)
    run = store.claim(factory, gate_id, worker)
    if run is None:
        log.info("gate %s not pending: skipped", gate_id, extra={"gate_id": gate_id})
        return "skipped"
    log.info("gate %s claimed by %s", gate_id, worker, extra={"gate_id": gate_id})
    try:
        spec = parse_spec(run.spec, source=f"gate {gate_id}")
    except GateError as exc:  # stored specs were validated; a schema change could break one
        _fail(factory, gate_id, exc.message)
        return "error"
    outcome = asyncio.run(
        run_gate(
            spec,
            settings,
            db_url=settings.resolved_database_url(),
            progress=NullProgress(),
            gate_id=gate_id,
            worker=worker,
        )
    )
    state = str(outcome.document["state"])
    log.info("gate %s finished: %s %s", gate_id, state, outcome.verdict, extra={"gate_id": gate_id})
    if run.callback:
        from gate.integrations.callbacks import deliver_callback

        deliver_callback(
            run.callback,
            store.verdict_summary(store.get_gate(factory, gate_id), settings.public_url),
            settings,
        )
    return state


def _fail(factory: sessionmaker[Session], gate_id: str, message: str) -> None:
    with transaction(factory) as s:
        run = s.get(GateRun, gate_id)
        if run is not None:
            store._end(run, "error", "gate.invalid_spec", message)
