"""Which requests a fault hits, decided when a request starts.

Each fault draws from its own RNG (seeded by ``--seed``), so enabling one fault does not move
which requests another one hits, and a rerun with the same seed and the same request order
hits the same requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from simengine.config import SimConfig


@dataclass(slots=True)
class FaultCounters:
    """Faults that struck inside streams, counted when they strike (for /metrics)."""

    hung_streams: int = 0
    stream_errors: int = 0


@dataclass(frozen=True, slots=True)
class StreamFaults:
    """Faults of one stream, as token counts after which they strike (None: not hit)."""

    hang_after: int | None = None
    error_after: int | None = None


NO_FAULTS = StreamFaults()


class FaultPlan:
    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self._errors = random.Random(f"faults-{config.seed}")
        self._hangs = random.Random(f"hangs-{config.seed}")
        self._stream_errors = random.Random(f"stream-errors-{config.seed}")
        self._hang_set = frozenset(config.hang_requests)
        self._slow = random.Random(f"slow-{config.seed}")

    def http_error(self) -> bool:
        """Answer this generation request with HTTP 500 (``--error-rate``)?"""
        rate = self._config.error_rate
        return rate > 0.0 and self._errors.random() < rate

    def ttft_factor(self) -> float:
        """TTFT multiplier of the next generation request: ``--slow-factor`` for a seeded
        ``--slow-share`` of them, else 1."""
        cfg = self._config
        if cfg.slow_share > 0.0 and self._slow.random() < cfg.slow_share:
            return cfg.slow_factor
        return 1.0

    def for_stream(self, number: int, max_tokens: int) -> StreamFaults:
        """Faults of generation request ``number`` (counted from 1), a stream.

        A stream error strikes after a uniform number of tokens in [1, max_tokens - 1] (0 for
        a one-token request); a request that ends earlier gets the error instead of its last
        event, so the rate is exact whatever the output length.
        """
        cfg = self._config
        if cfg.hang_after_tokens is None and cfg.stream_error_rate <= 0.0:
            return NO_FAULTS
        hang_after = None
        if cfg.hang_after_tokens is not None:
            if self._hang_set:
                hit = number in self._hang_set
            else:
                hit = self._hangs.random() < cfg.hang_rate
            hang_after = cfg.hang_after_tokens if hit else None
        error_after = None
        if cfg.stream_error_rate > 0.0 and self._stream_errors.random() < cfg.stream_error_rate:
            error_after = self._stream_errors.randint(1, max_tokens - 1) if max_tokens > 1 else 0
        return StreamFaults(hang_after, error_after)
