"""Verdict alerts, delivered at least once: planned when a gate is created, sent when it ends.

Who hears a gate: the operator's targets marked `every_gate` (GATE_ALERT_TARGETS), and the
spec's `notify` entries, each an operator's target by name or a URL on GATE_ALERT_ALLOW
(`notify_problems`, checked when the gate is created; the allow-list and the never-called
addresses are checked again when the alert is sent, so a setting removed later takes effect).
Each is one `alert_deliveries` row made in the create's transaction, so a gate ended from
outside (a reaper, a cancel while pending) still alerts. `on: hold` (the default) hears only
holds; a continue marks such a row done without a post.

Whoever finishes a gate sends its alerts at once (`send_alerts`); every reaper pass then tries
the ones still owed (`alerts_due`), each attempt claimed with a conditional update as the
commit-status callbacks are (gate/service/notify.py), at most ALERT_ATTEMPTS attempts of up to
three posts each, spaced ALERT_RETRY_S x the attempt number. A 4xx is final. Every row keeps
its attempts, posts, last HTTP status and what happened (`deliveries`,
`GET /v1/gates/{id}/alerts`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from gate.access.network import UrlRefused, check_always
from gate.core.clock import now
from gate.core.database import reading, transaction
from gate.core.errors import FieldProblem
from gate.core.settings import AlertTarget, Settings
from gate.integrations.alerts import AlertSent, post_alert
from gate.integrations.callbacks import allowed
from gate.models import AlertDelivery
from gate.service import repository, service
from gate.service.schemas import AlertDeliveryView, AlertPayload
from gate.spec import GateSpec

log = logging.getLogger("gate.runs")

ALERT_ATTEMPTS = 4
ALERT_RETRY_S = 30.0
DUE_BATCH = 50


def _targets(settings: Settings) -> dict[str, AlertTarget]:
    return {t.name: t for t in settings.alert_targets}


def notify_problems(spec: GateSpec, settings: Settings) -> list[FieldProblem]:
    """A spec's `notify` against the operator's settings: a target must be one of theirs, a
    URL on GATE_ALERT_ALLOW (a caller must not make the service post to an address of its
    choosing)."""
    targets, out = _targets(settings), []
    for i, n in enumerate(spec.notify):
        if n.target is not None and n.target not in targets:
            known = ", ".join(sorted(targets)) or "none"
            out.append(
                FieldProblem(
                    f"notify[{i}].target",
                    f"no alert target {n.target!r} (the operator's GATE_ALERT_TARGETS: {known})",
                )
            )
        if n.url is not None and not allowed(n.url, settings.alert_allow):
            out.append(
                FieldProblem(
                    f"notify[{i}].url",
                    "not on the operator's allow-list "
                    "(GATE_ALERT_ALLOW); name an operator's target instead",
                )
            )
    return out


def plan(spec: GateSpec, settings: Settings) -> list[AlertDelivery]:
    """The alert rows of a new gate (its id set by the caller): every_gate targets, then the
    spec's entries (a target named twice is one row)."""
    targets = _targets(settings)
    rows: dict[str, AlertDelivery] = {}
    for t in settings.alert_targets:
        if t.every_gate:
            rows[t.name] = AlertDelivery(target=t.name, url=None, format=t.format, on=t.on)
    for i, n in enumerate(spec.notify):
        if n.target is not None:
            own = targets[n.target]
            rows[n.target] = AlertDelivery(target=n.target, url=None, format=own.format, on=n.on)
        else:
            rows[f"notify[{i}]"] = AlertDelivery(
                target=f"notify[{i}]", url=n.url, format=n.format, on=n.on
            )
    return list(rows.values())


def _spaced(tried: datetime | None, attempts: int, at: datetime) -> bool:
    if tried is None:
        return True
    last = tried if tried.tzinfo is not None else tried.replace(tzinfo=at.tzinfo)
    return at - last >= timedelta(seconds=ALERT_RETRY_S * max(1, attempts))


def _claim(
    factory: sessionmaker[Session], row: AlertDelivery, verdict: str | None, at: datetime
) -> bool:
    """Take the row's next attempt; a verdict the target does not hear ends it unsent."""
    with transaction(factory) as s:
        live = s.get(AlertDelivery, row.id)
        if live is None or live.done or live.attempts >= ALERT_ATTEMPTS:
            return False
        if live.on == "hold" and verdict != "hold":
            live.done, live.result = True, f"not owed: the verdict is {verdict} (on: hold)"
            return False
        if not _spaced(live.tried_at, live.attempts, at):
            return False
        return repository.take_alert_attempt(s, row.id, live.attempts, at)


def _url(row: AlertDelivery, settings: Settings) -> str:
    """Where to post, under today's settings; UrlRefused when it may not be called."""
    if row.url is None:
        target = _targets(settings).get(row.target)
        if target is None:
            raise UrlRefused(f"the operator's target {row.target!r} is no longer configured")
        return target.url
    if not allowed(row.url, settings.alert_allow):
        raise UrlRefused("not on the operator's allow-list (GATE_ALERT_ALLOW)")
    check_always(row.url)  # every address the host resolves to, now
    return row.url


def _record(factory: sessionmaker[Session], alert_id: int, got: AlertSent) -> None:
    with transaction(factory) as s:
        live = s.get(AlertDelivery, alert_id)
        if live is None:
            return
        live.posts += got.posts
        live.last_status = got.status
        live.result = got.detail[:200]
        if got.sent:
            live.sent_at = now()
        live.done = got.sent or got.final or live.attempts >= ALERT_ATTEMPTS


def _send(
    factory: sessionmaker[Session], row: AlertDelivery, settings: Settings, at: datetime
) -> bool:
    run = service.get_gate(factory, row.gate_id)
    if not _claim(factory, row, run.verdict, at):
        return False
    try:
        url = _url(row, settings)
    except UrlRefused as exc:
        _record(factory, row.id, AlertSent(False, True, 0, None, f"not sent: {exc.message}"))
        return False
    payload = AlertPayload(
        name=run.name,
        candidate=run.candidate_label,
        reference=run.reference_label,
        verdict=service.verdict_summary(run, settings.public_url),
    )
    try:
        got = post_alert(url, row.format, payload, settings.alert_secret)
    except Exception as exc:  # never let an alert redo or break what called it
        log.exception("gate %s: alert %s failed", row.gate_id, row.target)
        got = AlertSent(False, False, 0, None, f"{type(exc).__name__}: {exc}")
    _record(factory, row.id, got)
    log.log(
        logging.INFO if got.sent else logging.WARNING,
        "gate %s: alert %s %s",
        row.gate_id,
        row.target,
        got.detail,
        extra={"gate_id": row.gate_id},
    )
    return got.sent


def send_alerts(
    factory: sessionmaker[Session], gate_id: str, settings: Settings, at: datetime | None = None
) -> int:
    """Try a finished gate's owed alerts now; returns how many were sent."""
    with reading(factory) as s:
        rows = repository.alert_rows(s, gate_id)
    return sum(_send(factory, r, settings, at or now()) for r in rows if not r.done)


def alerts_due(
    factory: sessionmaker[Session], settings: Settings, at: datetime | None = None
) -> int:
    """One reaper pass over the alerts still owed; returns how many were sent."""
    with reading(factory) as s:
        rows = repository.owed_alerts(s, ALERT_ATTEMPTS, DUE_BATCH)
    return sum(_send(factory, r, settings, at or now()) for r in rows)


def deliveries(factory: sessionmaker[Session], gate_id: str) -> list[AlertDeliveryView]:
    """What a gate's alerts did (the gate must exist: GateNotFound otherwise)."""
    service.get_gate(factory, gate_id)
    with reading(factory) as s:
        rows = repository.alert_rows(s, gate_id)
    return [
        AlertDeliveryView(
            target=r.target,
            format=r.format,
            on=r.on,
            attempts=r.attempts,
            posts=r.posts,
            last_status=r.last_status,
            sent=r.sent_at is not None,
            done=r.done,
            result=r.result,
            tried_at=r.tried_at,
            sent_at=r.sent_at,
        )
        for r in rows
    ]
