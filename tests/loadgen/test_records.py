"""Record helpers: the metric definitions, on hand-built records."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.records import ERROR_KINDS, RequestRecord, read_jsonl, write_jsonl


def record(**kw: object) -> RequestRecord:
    base: dict[str, object] = {
        "request_id": 0,
        "target": "ref",
        "intended_ns": 1_000,
        "sent_ns": 1_500,
    }
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_k_tokens_after_gap_g_give_k_gaps_of_g_over_k() -> None:
    r = record(chunk_ns=[10_000, 13_000, 19_000], chunk_tokens=[1, 3, 2])
    assert r.itl_gaps_ns() == [1_000, 1_000, 1_000, 3_000, 3_000]


def test_first_event_extra_tokens_contribute_nothing() -> None:
    r = record(chunk_ns=[10_000, 12_000], chunk_tokens=[4, 1])
    assert r.itl_gaps_ns() == [2_000]


def test_single_event_has_no_gaps() -> None:
    assert record(chunk_ns=[5], chunk_tokens=[7]).itl_gaps_ns() == []
    assert record().itl_gaps_ns() == []


@given(
    st.lists(st.tuples(st.integers(0, 10**7), st.integers(1, 8)), min_size=1, max_size=30),
)
def test_gaps_sum_to_first_to_last_and_count_tokens_after_first(
    events: list[tuple[int, int]],
) -> None:
    times = [0]
    for gap, _ in events[1:]:
        times.append(times[-1] + gap)
    tokens = [k for _, k in events]
    gaps = record(chunk_ns=times, chunk_tokens=tokens).itl_gaps_ns()
    assert len(gaps) == sum(tokens[1:])
    assert sum(gaps) == pytest.approx(times[-1] - times[0])


def test_latency_helpers() -> None:
    r = record(first_token_ns=3_500, end_ns=11_500, output_tokens=5)
    assert r.ttft_ns == 2_000
    assert r.e2e_ns == 10_000
    assert r.dispatch_delay_ns == 500
    assert r.tpot_ns == (11_500 - 3_500) / 4
    assert r.ok


def test_helpers_are_none_without_data() -> None:
    r = record(error_kind="connect", output_tokens=0)
    assert r.ttft_ns is None
    assert r.e2e_ns is None
    assert r.tpot_ns is None
    assert not r.ok
    one = record(first_token_ns=2_000, end_ns=2_000, output_tokens=1)
    assert one.tpot_ns is None  # no decode phase with a single token


def test_json_round_trip() -> None:
    r = record(
        first_token_ns=2_000,
        end_ns=9_000,
        status=200,
        output_tokens=2,
        prompt_tokens=4,
        chunk_ns=[2_000, 9_000],
        chunk_tokens=[1, 1],
        text=" a b ✓",
        token_ids=[1, 2],
        logprobs=[-0.5, -1.25],
        finish_reason="length",
    )
    line = r.to_json()
    assert "\n" not in line
    assert RequestRecord.from_json(line) == r
    failed = record(error_kind="stream_error", error_message="boom")
    assert RequestRecord.from_json(failed.to_json()) == failed


def test_jsonl_files(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    records = [record(request_id=i) for i in range(3)]
    assert write_jsonl(path, records) == 3
    assert list(read_jsonl(path)) == records


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("[]", "object"),
        ('{"request_id": 0}', "missing"),
        (
            '{"request_id": 0, "target": "a", "intended_ns": 0, "sent_ns": 0, "bogus": 1}',
            "unknown",
        ),
        (
            '{"request_id": 0, "target": "a", "intended_ns": 0, "sent_ns": 0, "error_kind": "x"}',
            "error_kind",
        ),
    ],
)
def test_from_json_rejects_bad_records(line: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RequestRecord.from_json(line)


def test_error_kinds_are_the_documented_set() -> None:
    assert set(ERROR_KINDS) == {
        "connect",
        "timeout",
        "http_4xx",
        "http_5xx",
        "stream_error",
        "protocol_error",
        "truncated",
    }
