"""Summary statistics over records: pure numpy, no I/O, JSON-ready.

Definitions are in ``records``. Choices made here:

- Latency percentiles (TTFT, ITL, TPOT, E2E) use successful requests only: a request that failed
  fast would otherwise look like a fast request.
- ITL pools every per-token gap of every successful request, so long outputs weigh in per token,
  which is what a user reading a stream experiences.
- Dispatch delay uses every request that was sent, failed or not: it measures the client, and a
  failing target must not hide a client that fell behind its schedule.
- Throughput counts successful requests and their output tokens over the run's wall duration.
- Empty samples give ``None`` (JSON null), never NaN, so the output is valid strict JSON.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypedDict

import numpy as np

from loadgen.records import ERROR_KINDS, RequestRecord


class Distribution(TypedDict):
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class RequestCounts(TypedDict):
    sent: int
    ok: int
    errors: int


class Throughput(TypedDict):
    requests_per_s: float | None
    output_tokens_per_s: float | None


class Summary(TypedDict):
    requests: RequestCounts
    errors_by_kind: dict[str, int]
    ttft_ms: Distribution
    itl_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    dispatch_delay_ms: Distribution
    output_tokens: int
    duration_s: float
    throughput: Throughput


def distribution(values_ms: Iterable[float]) -> Distribution:
    """Mean and p50/p90/p99 (numpy's linear interpolation); all ``None`` when empty."""
    arr = np.fromiter(values_ms, dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(arr, [50.0, 90.0, 99.0]).tolist()
    return {"mean": float(arr.mean()), "p50": p50, "p90": p90, "p99": p99}


def summarize(records: Sequence[RequestRecord], duration_s: float) -> Summary:
    """The run summary the CLI prints and the gate stores, for one target's records."""
    if not math.isfinite(duration_s) or duration_s < 0:
        raise ValueError(f"duration_s: must be a finite number >= 0, got {duration_s!r}")
    ok = [r for r in records if r.ok]
    errors_by_kind: dict[str, int] = dict.fromkeys(ERROR_KINDS, 0)
    for r in records:
        if r.error_kind is not None:
            errors_by_kind[r.error_kind] = errors_by_kind.get(r.error_kind, 0) + 1
    output_tokens = sum(r.output_tokens for r in ok)
    ms = 1e-6

    def per_request(values: Iterable[float | int | None]) -> Distribution:
        return distribution(v * ms for v in values if v is not None)

    return {
        "requests": {"sent": len(records), "ok": len(ok), "errors": len(records) - len(ok)},
        "errors_by_kind": errors_by_kind,
        "ttft_ms": per_request(r.ttft_ns for r in ok),
        "itl_ms": distribution(g * ms for r in ok for g in r.itl_gaps_ns()),
        "tpot_ms": per_request(r.tpot_ns for r in ok),
        "e2e_ms": per_request(r.e2e_ns for r in ok),
        "dispatch_delay_ms": per_request(r.dispatch_delay_ns for r in records),
        "output_tokens": output_tokens,
        "duration_s": float(duration_s),
        "throughput": {
            "requests_per_s": len(ok) / duration_s if duration_s > 0 else None,
            "output_tokens_per_s": output_tokens / duration_s if duration_s > 0 else None,
        },
    }
