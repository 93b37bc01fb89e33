"""Summary statistics over records: pure numpy, no I/O, JSON-ready.

Definitions are in ``records``. Choices made here:

- Latency percentiles (TTFT, ITL, TPOT, E2E) use successful requests only: a request that failed
  fast would otherwise look like a fast request.
- ITL pools every per-token gap of every successful request, so long outputs weigh in per token,
  which is what a user reading a stream experiences.
- Dispatch delay uses every request that was sent, failed or not: it measures the client, and a
  failing target must not hide a client that fell behind its schedule.
- Throughput counts successful requests and their output tokens over the run's wall duration.
- Goodput (given SLOs, e.g. ``{"ttft_ms": 200, "tpot_ms": 50}``): successful requests that
  meet every SLO (value <= limit), per second of the run, as vLLM bench, AIPerf and
  inference-perf define it. A request with one output token has no TPOT and meets a TPOT
  SLO: it had no decode phase to be slow in. Failed requests never count.
- Empty samples give ``None`` (JSON null), never NaN, so the output is valid strict JSON.
- ``requests.resent`` counts requests sent once more on a fresh connection because the server
  closed a kept-alive one under them (``RequestRecord.resent``): shown, never errors, since
  the race was the client's; their latencies count from the resend.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NotRequired, TypedDict

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
    resent: int


class Throughput(TypedDict):
    requests_per_s: float | None
    output_tokens_per_s: float | None


class Goodput(TypedDict):
    slos: dict[str, float]
    requests: int
    fraction: float | None
    requests_per_s: float | None


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
    goodput: NotRequired[Goodput]


SLO_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
"""Per-request metrics an SLO may bound."""


def distribution(values_ms: Iterable[float]) -> Distribution:
    """Mean and p50/p90/p99 (numpy's linear interpolation); all ``None`` when empty."""
    arr = np.fromiter(values_ms, dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(arr, [50.0, 90.0, 99.0]).tolist()
    return {"mean": float(arr.mean()), "p50": p50, "p90": p90, "p99": p99}


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    slos: Mapping[str, float] | None = None,
) -> Summary:
    """The run summary the CLI prints and the gate stores, for one target's records.

    ``slos`` adds ``goodput``; without it the keys are exactly those of :class:`Summary`'s
    required fields, which the gate relies on.
    """
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

    summary: Summary = {
        "requests": {
            "sent": len(records),
            "ok": len(ok),
            "errors": len(records) - len(ok),
            "resent": sum(1 for r in records if r.resent),
        },
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
    if slos is not None:
        summary["goodput"] = goodput(records, duration_s, slos)
    return summary


def meets_slos(record: RequestRecord, slos: Mapping[str, float]) -> bool:
    """Whether one request succeeded and met every SLO."""
    if not record.ok:
        return False
    for name, limit in slos.items():
        if name == "ttft_ms":
            value: float | None = None if record.ttft_ns is None else record.ttft_ns / 1e6
            if value is None:
                return False
        elif name == "tpot_ms":
            value = None if record.tpot_ns is None else record.tpot_ns / 1e6
        else:
            value = None if record.e2e_ns is None else record.e2e_ns / 1e6
            if value is None:
                return False
        if value is not None and value > limit:
            return False
    return True


def goodput(
    records: Sequence[RequestRecord], duration_s: float, slos: Mapping[str, float]
) -> Goodput:
    """Requests meeting every SLO: count, share of requests sent, and rate."""
    checked = check_slos(slos)
    good = sum(1 for r in records if meets_slos(r, checked))
    return {
        "slos": checked,
        "requests": good,
        "fraction": good / len(records) if records else None,
        "requests_per_s": good / duration_s if duration_s > 0 else None,
    }


def check_slos(slos: Mapping[str, float]) -> dict[str, float]:
    """Validate SLOs, naming the bad one; returns them as plain floats."""
    out: dict[str, float] = {}
    for name, limit in slos.items():
        if name not in SLO_METRICS:
            raise ValueError(f"slos: unknown metric {name!r} (use {', '.join(SLO_METRICS)})")
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            raise ValueError(f"slos: {name} must be a number, got {limit!r}")
        if not (math.isfinite(limit) and limit > 0):
            raise ValueError(f"slos: {name} must be a finite number > 0, got {limit!r}")
        out[name] = float(limit)
    return out
