"""A spec's history, as the API and the pages read it: the identities with gates, and one
identity's gates page by page (newest first, a `before` cursor on the finish time), each as
its stored `HistoryEntry` (gate/verdict/history.py). Queries are repository.py's."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import Session, sessionmaker

from gate.core.clock import utc_text
from gate.core.database import reading
from gate.core.errors import FieldProblem, HistoryNotFound, SpecError
from gate.service import repository
from gate.service.schemas import AaRate, HistoryList, HistoryPage, HistorySpec
from gate.verdict.history import HistoryEntry

MAX_HISTORY_PAGE = 200
MAX_HISTORY_SPECS = 100


def _bounded(field: str, value: int, most: int) -> None:
    if not 1 <= value <= most:
        raise SpecError([FieldProblem(field, f"must be between 1 and {most}, got {value}")])


def spec_histories(factory: sessionmaker[Session], limit: int = 50, offset: int = 0) -> HistoryList:
    """Each spec identity with finished gates, the most recently finished first."""
    _bounded("limit", limit, MAX_HISTORY_SPECS)
    if offset < 0:
        raise SpecError([FieldProblem("offset", f"must be 0 or more, got {offset}")])
    with reading(factory) as s:
        rows, total = repository.history_identities(s, limit, offset)
    items = [
        HistorySpec(
            identity=identity,
            name=name,
            gates=gates,
            aa_gates=aa,
            last_finished_at=utc_text(last) if last is not None else None,
        )
        for identity, name, gates, aa, last in rows
    ]
    return HistoryList(items=items, total=total, limit=limit, offset=offset)


def aa_rate(entries: list[HistoryEntry]) -> AaRate:
    aa = [e for e in entries if e.aa]
    holds = sum(1 for e in aa if e.verdict == "hold")
    return AaRate(gates=len(aa), holds=holds, hold_rate=holds / len(aa) if aa else None)


def spec_history(
    factory: sessionmaker[Session],
    identity: str,
    limit: int = 50,
    before: datetime | None = None,
) -> HistoryPage:
    """One identity's gates, newest first, finished before `before`; NotFound when the
    identity has none."""
    _bounded("limit", limit, MAX_HISTORY_PAGE)
    if before is not None:  # stored times are UTC; a time without a zone is too
        before = before.astimezone(UTC) if before.tzinfo else before.replace(tzinfo=UTC)
    with reading(factory) as s:
        runs, total = repository.history_page(s, identity, limit, before)
    if total == 0:
        raise HistoryNotFound(identity)
    entries = [HistoryEntry.model_validate(r.history) for r in runs if r.history is not None]
    newest = runs[0] if runs else None
    spec = newest.spec if newest is not None else {}
    last = runs[-1].finished_at if len(runs) == limit else None
    return HistoryPage(
        identity=identity,
        name=str(spec.get("name", newest.name if newest else "")),
        model=spec.get("model"),
        shape=dict(spec.get("shape") or {}),
        total=total,
        limit=limit,
        entries=entries,
        next_before=utc_text(last) if last is not None else None,
        aa=aa_rate(entries),
    )
