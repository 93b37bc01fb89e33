"""Commit-status callbacks of finished gates, delivered at least once.

Whoever finishes a gate tries its callback at once (`notify`); every reaper pass then tries
the ones still owed (`notify_due`): a gate ended by a reaper (its worker lost), cancelled
before it started, or whose finisher died before it could call. Each attempt is claimed with
a conditional update, so two processes never make the same attempt; a commit status is a
"set", so the rare repeat after a lost answer is harmless.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session, sessionmaker

from gate.core.settings import Settings
from gate.integrations.callbacks import deliver_callback
from gate.service import service
from gate.service.schemas import CallbackTarget

log = logging.getLogger("gate.runs")


def notify(factory: sessionmaker[Session], gate_id: str, settings: Settings) -> bool | None:
    """Try the gate's callback now if it is owed and due: True sent, False not (recorded),
    None nothing to do."""
    run = service.claim_callback(factory, gate_id)
    if run is None or run.callback is None:
        return None
    try:
        result = deliver_callback(
            CallbackTarget.model_validate(run.callback),
            service.verdict_summary(run, settings.public_url),
            settings,
        )
    except Exception as exc:  # never let a callback redo or break what called it
        log.exception("gate %s: callback failed", gate_id, extra={"gate_id": gate_id})
        service.record_callback(
            factory, gate_id, sent=False, final=False, result=f"{type(exc).__name__}: {exc}"
        )
        return False
    service.record_callback(
        factory, gate_id, sent=result.sent, final=result.final, result=result.detail
    )
    level = logging.INFO if result.sent else logging.WARNING
    log.log(
        level,
        "gate %s: callback %s (attempt %d)",
        gate_id,
        result.detail,
        run.callback_attempts,
        extra={"gate_id": gate_id},
    )
    return result.sent


def notify_due(factory: sessionmaker[Session], settings: Settings) -> list[str]:
    """One pass over the callbacks still owed; returns the gates whose callback was sent."""
    sent: list[str] = []
    for gid in service.due_callbacks(factory):
        if notify(factory, gid, settings):
            sent.append(gid)
    return sent
