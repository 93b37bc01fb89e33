from __future__ import annotations

import io

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.analysis.samples import Columns, columns_from_records, drop_warmup
from loadgen.records import RequestRecord

T0 = 1_000_000_000


def rec(
    i: int, ttft_ms: float = 40.0, gaps: tuple[int, ...] = (1, 1, 2), error: str | None = None
) -> RequestRecord:
    sent = T0 + i * 50_000_000
    if error:
        return RequestRecord(
            i,
            "r",
            sent - 1000,
            sent,
            status=500,
            error_kind=error,  # type: ignore[arg-type]
            error_message="boom",
        )
    first = sent + int(ttft_ms * 1e6)
    chunk_ns = [first]
    for k in gaps:
        chunk_ns.append(chunk_ns[-1] + 10_000_000 * k)
    tokens = [1, *gaps]
    return RequestRecord(
        i,
        "r",
        sent - 1000,
        sent,
        first_token_ns=first,
        end_ns=chunk_ns[-1],
        status=200,
        output_tokens=sum(tokens),
        chunk_ns=chunk_ns,
        chunk_tokens=tokens,
    )


def test_columns_compute_ttft_itl_and_errors() -> None:
    records = [rec(0), rec(1, ttft_ms=60), rec(2, error="http_5xx")]
    cols = columns_from_records(records, T0)
    assert len(cols) == 3
    np.testing.assert_allclose(cols.ttft_ms(), [40.0, 60.0])
    # gaps: event of 1 token after 10ms, 1 after 10ms, 2 tokens after 20ms -> 4 gaps of 10ms
    np.testing.assert_allclose(cols.itl_ms(), [10.0, 10.0])
    assert cols.errors() == {"http_5xx": 1}
    arm = cols.to_arm()
    assert arm.requests == 3 and arm.ttft_ms.size == 2
    np.testing.assert_allclose(arm.error_offsets_s, [0.1])


def test_a_resent_request_is_a_column_not_an_error() -> None:
    records = [rec(0), rec(1), rec(2, error="connect")]
    records[1].resent = True
    cols = columns_from_records(records, T0)
    assert cols.resent.tolist() == [False, True, False]
    assert cols.ok.tolist() == [True, True, False]
    assert cols.summary() == {"requests": 3, "ok": 2, "errors": {"connect": 1}, "resent": 1}
    assert drop_warmup(cols, 1).resent.tolist() == [True, False]


def test_columns_stored_before_resent_read_back_with_none_resent() -> None:
    cols = columns_from_records([rec(i) for i in range(4)], T0)
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: getattr(cols, k) for k in Columns.__slots__ if k != "resent"})
    back = Columns.from_bytes(buf.getvalue())
    assert back.resent.tolist() == [False] * 4


def test_roundtrip_and_warmup_drop() -> None:
    records = [rec(i, gaps=(1,) * (i % 4 + 1)) for i in range(20)]
    records[3].resent = True
    cols = columns_from_records(records, T0)
    back = Columns.from_bytes(cols.to_bytes())
    for name in Columns.__slots__:
        np.testing.assert_array_equal(getattr(back, name), getattr(cols, name))
    dropped = drop_warmup(cols, 5)
    assert len(dropped) == 15 and dropped.request_id[0] == 5
    assert dropped.gap_offsets[-1] == dropped.gaps_ns.size
    for j, i in enumerate(range(5, 20)):
        part = dropped.gaps_ns[dropped.gap_offsets[j] : dropped.gap_offsets[j + 1]]
        assert part.size == i % 4 + 1


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(1, 500), st.lists(st.integers(1, 4), min_size=1, max_size=6)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 10),
)
def test_property_drop_keeps_gap_alignment(spec: list[tuple[float, list[int]]], warm: int) -> None:
    records = [rec(i, ttft_ms=t, gaps=tuple(g)) for i, (t, g) in enumerate(spec)]
    cols = drop_warmup(columns_from_records(records, T0), warm)
    assert len(cols) == max(0, len(spec) - warm)
    for j in range(len(cols)):
        part = cols.gaps_ns[cols.gap_offsets[j] : cols.gap_offsets[j + 1]]
        np.testing.assert_allclose(part.mean() if part.size else np.nan, cols.itl_mean_ns[j])
