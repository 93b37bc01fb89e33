"""Wall-clock time for stored timestamps, in one place below every package that writes them.

Durations are measured on monotonic clocks elsewhere; this is only for the columns
(`heartbeat_at`, `expires_at`, `last_used_at`) that other processes compare against, and for
the one way every answer and document writes a timestamp (`utc_text`, `Timestamp`): SQLite
hands stored times back naive (UTC without saying so), PostgreSQL and a row just made hand
them back aware, and a client must not see `...Z` from one endpoint and no zone from another.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import PlainSerializer, WithJsonSchema


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def utc_text(t: datetime) -> str:
    """`2026-12-06T23:03:51.161821Z`: ISO 8601 in UTC, always with its zone, always `Z`. A
    naive time is UTC (what SQLite hands back of what `now()` stored)."""
    aware = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return aware.isoformat(timespec="microseconds").replace("+00:00", "Z")


# A datetime field of an answer: written by `utc_text`, whatever the database handed back.
Timestamp = Annotated[
    datetime,
    PlainSerializer(utc_text, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}, mode="serialization"),
]
