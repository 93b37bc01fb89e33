"""When each stream event is due.

Kept apart from the engine so that a richer model (batch steps, prefill chunking, memory
pressure) can replace it without touching the HTTP or decoding code.
"""

from __future__ import annotations

import math
import random

from gate.engines.sim.config import SimConfig

_NS_PER_MS = 1_000_000
_NS_PER_US = 1_000


class TimingModel:
    """Delays in integer nanoseconds, so deadlines add up exactly on the monotonic clock.

    Jitter is a lognormal multiplier with median 1 (``exp(sigma * Z)``), drawn from one RNG
    seeded by ``--seed``: the sequence of draws is reproducible, though which request gets
    which draw depends on how requests interleave.
    """

    def __init__(self, config: SimConfig) -> None:
        self._ttft_ns = config.ttft_ms * _NS_PER_MS
        self._prefill_ns_per_token = config.prefill_us_per_token * _NS_PER_US
        self._itl_ns = config.itl_ms * _NS_PER_MS
        self._itl_per_running_ns = config.itl_per_running_ms * _NS_PER_MS
        self._sigma = config.jitter
        self._rng = random.Random(config.seed)

    def _jitter(self) -> float:
        if self._sigma <= 0.0:
            return 1.0
        return math.exp(self._rng.gauss(0.0, self._sigma))

    def first_event_delay_ns(self, prompt_tokens: int) -> int:
        """Queue-free time to first token: fixed overhead plus a prefill cost per token."""
        base = self._ttft_ns + self._prefill_ns_per_token * prompt_tokens
        return round(base * self._jitter())

    def next_event_delay_ns(self, running: int) -> int:
        """Gap to the next event; every other running request slows decoding a little."""
        others = max(0, running - 1)
        base = self._itl_ns + self._itl_per_running_ns * others
        return round(base * self._jitter())
