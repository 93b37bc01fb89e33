"""Open-loop arrival schedules, computed up front.

The whole schedule is precomputed as offsets from the start so that the runner sleeps until an
absolute instant (``start + t_i``) instead of sleeping a gap after each send: sleep overshoot then
never accumulates, a slow response can never push later sends back (coordinated omission), and
the same seed gives the same instants on every run and for every target of a paired run.

The first request is sent at offset 0 for every arrival process, so a run never starts with an
idle random wait; gaps follow from there.
"""

from __future__ import annotations

import math
import operator
from typing import Literal

import numpy as np
import numpy.typing as npt

Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[Arrival, ...] = ("poisson", "constant", "gamma")

MAX_REQUESTS = 10_000_000
"""Refuse schedules larger than this: a typo in rate or duration should fail, not eat memory."""


def build_offsets(
    arrival: Arrival,
    rate: float,
    *,
    requests: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> npt.NDArray[np.float64]:
    """Intended send times in seconds from the start: sorted, starting at 0, seeded.

    ``poisson`` draws exponential gaps, ``gamma`` draws gamma gaps with shape ``burstiness`` and
    the same mean ``1/rate`` (below 1 is burstier than Poisson, above 1 smoother; 1 is Poisson,
    as in vLLM bench), ``constant`` spaces requests exactly ``1/rate`` apart. Give exactly one of
    ``requests`` (that many offsets) or ``duration_s`` (every offset strictly below it).
    """
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival: must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    rate = _positive("rate", rate)
    burstiness = _positive("burstiness", burstiness)
    if (requests is None) == (duration_s is None):
        raise ValueError("requests/duration_s: give exactly one of requests or duration_s")

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    if requests is not None:
        n = _count(requests)
        return _offsets(arrival, rate, burstiness, n, rng)

    assert duration_s is not None
    duration_s = _positive("duration_s", duration_s)
    expected = rate * duration_s
    if expected > MAX_REQUESTS:
        raise ValueError(
            f"duration_s: rate * duration_s = {expected:.0f} requests exceeds {MAX_REQUESTS}"
        )
    if arrival == "constant":
        n = math.ceil(expected) + 1
        offsets = np.arange(n, dtype=np.float64) / rate
        return offsets[offsets < duration_s]
    # Draw in batches until the schedule passes the duration; batches come from one generator
    # in sequence, so the result depends only on the seed.
    batch = int(expected + 6.0 * math.sqrt(expected) + 16)
    parts = [_offsets(arrival, rate, burstiness, batch, rng)]
    while parts[-1][-1] < duration_s:
        last = parts[-1][-1]
        gaps = _gaps(arrival, rate, burstiness, batch, rng)
        parts.append(last + np.cumsum(gaps))
    offsets = np.concatenate(parts)
    return offsets[offsets < duration_s]


def _positive(name: str, value: float) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return x


def _count(requests: int) -> int:
    try:
        if isinstance(requests, bool):
            raise TypeError
        n = operator.index(requests)
    except TypeError:
        raise ValueError(f"requests: must be an integer, got {requests!r}") from None
    if n < 1:
        raise ValueError(f"requests: must be >= 1, got {n}")
    if n > MAX_REQUESTS:
        raise ValueError(f"requests: must be <= {MAX_REQUESTS}, got {n}")
    return n


def _gaps(
    arrival: Arrival, rate: float, burstiness: float, n: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if arrival == "gamma":
        return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    return np.full(n, 1.0 / rate, dtype=np.float64)


def _offsets(
    arrival: Arrival, rate: float, burstiness: float, n: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    if arrival == "constant":
        # Multiply rather than cumulate so offset i is exactly i/rate, with no rounding drift.
        return np.arange(n, dtype=np.float64) / rate
    offsets = np.empty(n, dtype=np.float64)
    offsets[0] = 0.0
    np.cumsum(_gaps(arrival, rate, burstiness, n - 1, rng), out=offsets[1:])
    return offsets
