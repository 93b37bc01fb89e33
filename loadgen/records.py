"""One record per request per target: the raw observations every metric is derived from.

Records keep raw monotonic timestamps rather than finished metrics so that a metric definition
can change (the field disagrees on ITL and TPOT, see ``metrics``) without re-running a load, and
so that the gate can pair the same request across targets after the fact. Timestamps are
``time.monotonic_ns()`` values: they are only meaningful relative to each other within one
process, which is all that paired comparison needs, and they cannot jump with NTP the way
``time.time()`` does.

Our metric definitions, chosen deliberately (the field disagrees):

- TTFT: first event that carries a content token minus the actual send time. The role-only first
  chat chunk is not a token (vLLM bench counts it and so under-reports TTFT).
- ITL: per token, not per event. An event carrying ``k`` tokens after a gap ``g`` contributes
  ``k`` gaps of ``g / k`` (SGLang's convention). Per-event gaps would over-state latency for
  engines that batch tokens into one chunk, and giving intra-chunk tokens a gap of 0
  (inference-perf) would under-state it; spreading keeps ``sum(gaps) == last - first``.
- TPOT: ``(end - first token) / (output_tokens - 1)``, the decode-only rate per request.
- Dispatch delay: actual send minus intended send. It is how the client proves it was not the
  bottleneck (hidden client queueing of over a second has been found in other tools).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

ErrorKind = Literal[
    "connect",
    "timeout",
    "http_4xx",
    "http_5xx",
    "stream_error",
    "protocol_error",
    "truncated",
]
"""Why a request failed; ``None`` on a record means it succeeded."""

# Append-only: the gate stores an index into this tuple in its sample columns.
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


@dataclass(slots=True)
class RequestRecord:
    """What one target did with one scheduled request.

    ``request_id`` is the index in the schedule and is shared by every target that was sent the
    same request, which is what lets the gate compare them pairwise.
    """

    request_id: int
    target: str
    intended_ns: int
    sent_ns: int
    first_token_ns: int | None = None
    end_ns: int | None = None
    status: int | None = None
    error_kind: ErrorKind | None = None
    error_message: str | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    text: str = ""
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    # Sent once more on a fresh connection: the server closed the kept-alive one under it
    # before answering (the client's race, not an engine error; loadgen/transport.py).
    resent: bool = False

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def ttft_ns(self) -> int | None:
        if self.first_token_ns is None:
            return None
        return self.first_token_ns - self.sent_ns

    @property
    def e2e_ns(self) -> int | None:
        if self.end_ns is None:
            return None
        return self.end_ns - self.sent_ns

    @property
    def dispatch_delay_ns(self) -> int:
        return self.sent_ns - self.intended_ns

    @property
    def tpot_ns(self) -> float | None:
        """Mean time per output token after the first; ``None`` when there is no decode phase."""
        if self.first_token_ns is None or self.end_ns is None or self.output_tokens < 2:
            return None
        return (self.end_ns - self.first_token_ns) / (self.output_tokens - 1)

    def itl_gaps_ns(self) -> list[float]:
        """Per-token inter-token gaps, spreading each event's gap over the tokens it carries.

        The first event's extra tokens contribute nothing: there is no earlier token to measure
        their gap from, and inventing one would bias ITL toward TTFT.
        """
        gaps: list[float] = []
        for j in range(1, min(len(self.chunk_ns), len(self.chunk_tokens))):
            k = self.chunk_tokens[j]
            if k <= 0:
                continue
            g = (self.chunk_ns[j] - self.chunk_ns[j - 1]) / k
            gaps.extend([g] * k)
        return gaps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """Rebuild a record, refusing unknown or missing keys so schema drift fails loudly."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown RequestRecord fields: {sorted(unknown)}")
        missing = {"request_id", "target", "intended_ns", "sent_ns"} - set(data)
        if missing:
            raise ValueError(f"missing RequestRecord fields: {sorted(missing)}")
        kind = data.get("error_kind")
        if kind is not None and kind not in ERROR_KINDS:
            raise ValueError(f"error_kind: unknown kind {kind!r}")
        return cls(**data)

    def to_json(self) -> str:
        """One JSON line (no trailing newline), so records stream to JSONL as they finish."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("a RequestRecord JSON line must be an object")
        return cls.from_dict(data)


def write_jsonl(path: str | Path, records: Iterable[RequestRecord]) -> int:
    """Write records one per line; returns how many were written."""
    n = 0
    with Path(path).open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(record.to_json())
            fh.write("\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[RequestRecord]:
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield RequestRecord.from_json(line)
