"""summarize() on hand-built records: exact keys, exact numbers, no NaN."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from loadgen.metrics import distribution, summarize
from loadgen.records import ERROR_KINDS, RequestRecord

MS = 1_000_000

KEYS = {
    "requests",
    "errors_by_kind",
    "ttft_ms",
    "itl_ms",
    "tpot_ms",
    "e2e_ms",
    "dispatch_delay_ms",
    "output_tokens",
    "duration_s",
    "throughput",
}


def ok_record(i: int, ttft_ms: float, gaps_ms: list[float], delay_ms: float = 0.0) -> RequestRecord:
    sent = 1_000 * MS * i
    first = sent + int(ttft_ms * MS)
    chunk_ns = [first]
    for g in gaps_ms:
        chunk_ns.append(chunk_ns[-1] + int(g * MS))
    return RequestRecord(
        request_id=i,
        target="t",
        intended_ns=sent - int(delay_ms * MS),
        sent_ns=sent,
        first_token_ns=first,
        end_ns=chunk_ns[-1],
        status=200,
        output_tokens=len(chunk_ns),
        chunk_ns=chunk_ns,
        chunk_tokens=[1] * len(chunk_ns),
    )


def failed(i: int, kind: str, delay_ms: float = 0.0) -> RequestRecord:
    return RequestRecord(
        request_id=i,
        target="t",
        intended_ns=-int(delay_ms * MS),
        sent_ns=0,
        end_ns=MS,
        error_kind=kind,  # type: ignore[arg-type]
        output_tokens=3,
    )


def test_exact_shape_and_values() -> None:
    records = [
        ok_record(0, ttft_ms=10, gaps_ms=[2, 2, 2], delay_ms=1),
        ok_record(1, ttft_ms=30, gaps_ms=[4], delay_ms=3),
        failed(2, "http_5xx", delay_ms=5),
        failed(3, "timeout"),
    ]
    s = summarize(records, duration_s=2.0)
    assert set(s) == KEYS
    assert s["requests"] == {"sent": 4, "ok": 2, "errors": 2, "resent": 0}
    assert set(s["errors_by_kind"]) == set(ERROR_KINDS)
    assert s["errors_by_kind"]["http_5xx"] == 1
    assert s["errors_by_kind"]["timeout"] == 1
    assert sum(s["errors_by_kind"].values()) == 2
    assert s["ttft_ms"]["mean"] == pytest.approx(20)
    assert s["ttft_ms"]["p50"] == pytest.approx(20)
    assert s["itl_ms"]["mean"] == pytest.approx((2 + 2 + 2 + 4) / 4)
    assert s["tpot_ms"]["mean"] == pytest.approx((2 + 4) / 2)
    assert s["e2e_ms"]["mean"] == pytest.approx((16 + 34) / 2)
    # dispatch delay covers failed requests too
    assert s["dispatch_delay_ms"]["mean"] == pytest.approx((1 + 3 + 5 + 0) / 4)
    assert s["output_tokens"] == 4 + 2  # failed requests' tokens are not throughput
    assert s["duration_s"] == 2.0
    assert s["throughput"] == {"requests_per_s": 1.0, "output_tokens_per_s": 3.0}
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "dispatch_delay_ms"):
        assert set(s[key]) == {"mean", "p50", "p90", "p99"}  # type: ignore[literal-required]


def test_a_resent_request_is_counted_and_is_no_error() -> None:
    records = [ok_record(i, ttft_ms=10, gaps_ms=[2]) for i in range(3)]
    records[1].resent = True
    s = summarize(records, duration_s=1.0)
    assert s["requests"] == {"sent": 3, "ok": 3, "errors": 0, "resent": 1}
    assert sum(s["errors_by_kind"].values()) == 0


def test_percentiles_match_numpy() -> None:
    rng = np.random.default_rng(0)
    ttfts = rng.uniform(5, 50, size=101)
    records = [ok_record(i, float(t), [1.0]) for i, t in enumerate(ttfts)]
    s = summarize(records, 10.0)
    for p in (50, 90, 99):
        expected = np.percentile([r.ttft_ns for r in records], p) / MS
        assert s["ttft_ms"][f"p{p}"] == pytest.approx(expected)  # type: ignore[literal-required]


def test_empty_and_all_failed_give_nulls_not_nan() -> None:
    for records in ([], [failed(0, "connect")]):
        s = summarize(records, 0.0)
        text = json.dumps(s, allow_nan=False)  # raises on NaN
        assert "NaN" not in text
        assert s["ttft_ms"] == {"mean": None, "p50": None, "p90": None, "p99": None}
        assert s["throughput"] == {"requests_per_s": None, "output_tokens_per_s": None}


def test_single_token_requests_have_no_itl_or_tpot() -> None:
    s = summarize([ok_record(0, 5, [])], 1.0)
    assert s["itl_ms"]["mean"] is None
    assert s["tpot_ms"]["mean"] is None
    assert s["ttft_ms"]["mean"] == pytest.approx(5)


def test_distribution_helper() -> None:
    d = distribution([1.0, 2.0, 3.0, 4.0])
    assert d["mean"] == 2.5
    assert d["p50"] == 2.5
    assert all(isinstance(v, float) for v in d.values())


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_duration(bad: float) -> None:
    with pytest.raises(ValueError, match="duration_s"):
        summarize([], bad)


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = [
        ok_record(0, ttft_ms=100, gaps_ms=[10, 10]),  # meets both
        ok_record(1, ttft_ms=300, gaps_ms=[10, 10]),  # TTFT too slow
        ok_record(2, ttft_ms=100, gaps_ms=[60, 60]),  # TPOT too slow
        ok_record(3, ttft_ms=200, gaps_ms=[]),  # one token: no TPOT, meets; TTFT == limit meets
        failed(4, "http_5xx"),  # never good
    ]
    s = summarize(records, duration_s=2.0, slos={"ttft_ms": 200, "tpot_ms": 50})
    good = s["goodput"]
    assert good["requests"] == 2
    assert good["requests_per_s"] == 1.0
    assert good["fraction"] == pytest.approx(2 / 5)
    assert good["slos"] == {"ttft_ms": 200.0, "tpot_ms": 50.0}
    assert "goodput" not in summarize(records, 2.0)  # no SLOs: the keys the gate expects
    e2e = summarize(records, 2.0, slos={"e2e_ms": 210})["goodput"]
    assert e2e["requests"] == 2  # 120 ms and 200 ms end to end; 220 and 320 are not


@pytest.mark.parametrize("slos", [{"latency": 1.0}, {"ttft_ms": 0}, {"ttft_ms": "fast"}])
def test_bad_slos_are_named(slos: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="slos"):
        summarize([], 1.0, slos=slos)  # type: ignore[arg-type]
