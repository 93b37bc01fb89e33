"""Per-request records for report tests: streams of a known shape, for charts and pages."""

from __future__ import annotations

from loadgen.records import RequestRecord


def streamed_records(n: int, ttft_ms: float, text: str = "") -> list[RequestRecord]:
    """`n` streamed requests 10 ms apart, TTFT about `ttft_ms`, 8 chunks 12 ms apart, each
    answering `text`."""
    out = []
    for i in range(n):
        sent = i * 10_000_000
        first = sent + int(ttft_ms * 1e6 * (1 + 0.01 * (i % 7)))
        chunks = [first + j * 12_000_000 for j in range(8)]
        out.append(
            RequestRecord(
                i, "x", sent, sent, first, chunks[-1], 200, None, None, 8, 16, chunks, [1] * 8, text
            )
        )
    return out
