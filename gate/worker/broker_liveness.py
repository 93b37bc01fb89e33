"""A running gate's proof of life through the broker, beside its heartbeat in the database.

A worker cut off from the database (an outage, a restart, a write lock) cannot write its gate's
heartbeat, yet it is alive and, while it can, runs the gate safely (the reservation lease stops
the gate before its GPUs could go to anyone else). So every heartbeat also sets a key in the
broker's Redis that expires after `GATE_LOST_AFTER_S`; the reaper ends a gate whose database
heartbeat is stale only when the broker holds no such key either, and says which of the two
went silent. A broker that cannot be read proves nothing, so the reaper then ends nobody.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("gate.worker")

KEY_PREFIX = "gate:alive:"
TIMEOUT_S = 1.0
WARN_EVERY_S = 60.0


def alive_key(gate_id: str) -> str:
    return f"{KEY_PREFIX}{gate_id}"


class BrokerLiveness:
    """Writes and reads the broker's proof-of-life keys (redis-py, short timeouts: a broker
    outage must not stall a heartbeat)."""

    def __init__(self, url: str, ttl_s: float) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries: a broker that does not answer must cost one timeout, not ten, or the
        # heartbeat it shares a thread with would fall behind.
        self.client: Any = redis.Redis.from_url(
            url,
            socket_timeout=TIMEOUT_S,
            socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
        )
        self.ttl_s = max(1, int(ttl_s))
        self._warned = 0.0

    def beat(self, gate_id: str, worker: str) -> None:
        """Mark the gate alive for `ttl_s`; a failure is logged (once a minute), never raised."""
        try:
            self.client.set(alive_key(gate_id), worker, ex=self.ttl_s)
        except Exception as exc:
            now = time.monotonic()
            if now - self._warned >= WARN_EVERY_S:
                self._warned = now
                log.warning("gate %s: cannot mark it alive in the broker: %s", gate_id, exc)

    def forget(self, gate_id: str) -> None:
        try:
            self.client.delete(alive_key(gate_id))
        except Exception:
            log.debug("gate %s: cannot clear its broker key", gate_id, exc_info=True)

    def alive_ids(self) -> set[str] | None:
        """The gates some worker marked alive within `ttl_s`; None when the broker cannot be
        read (then nobody can be shown dead)."""
        try:
            keys = list(self.client.scan_iter(match=f"{KEY_PREFIX}*", count=500))
        except Exception as exc:
            log.warning("cannot read the broker's proof-of-life keys: %s", exc)
            return None
        out = set()
        for key in keys:
            text = key.decode() if isinstance(key, bytes) else str(key)
            out.add(text.removeprefix(KEY_PREFIX))
        return out

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            log.debug("closing the broker client failed", exc_info=True)
