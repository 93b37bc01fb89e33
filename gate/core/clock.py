"""Wall-clock time for stored timestamps, in one place below every package that writes them.

Durations are measured on monotonic clocks elsewhere; this is only for the columns
(`heartbeat_at`, `expires_at`, `last_used_at`) that other processes compare against.
"""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)
