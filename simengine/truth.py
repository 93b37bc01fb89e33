"""Ground truth for client benchmarks: when each request arrived and each event really left.

A load generator measures TTFT and ITL from what it receives; to check those measurements,
the sim records the same events from its side, on ``time.monotonic_ns()``, which is
CLOCK_MONOTONIC and so shared by every process on the host. One JSON line per finished
generation request:

    {"request_id": ..., "path": "/v1/completions", "status": 200, "arrival_ns": ...,
     "read_ns": ..., "events": [[emitted_ns, tokens], ...], "scheduled_ns": [...]}

``arrival_ns`` is when the request's last bytes reached the host: the kernel's receive stamp
(``SO_TIMESTAMPNS``, see ``rxstamp``) where the platform has one, so it does not depend on how
busy the sim's event loop was; ``read_ns`` is when the sim parsed it (``read_ns - arrival_ns``
is the sim's intake latency, which is part of the TTFT any client sees).

``events`` holds only SSE events that carry content tokens (not chat's role-only chunk, not
the usage-only chunk, not an error event, not ``[DONE]``); ``emitted_ns`` is taken right after
the event's bytes went to the transport; ``scheduled_ns`` is when the performance model meant
the event to leave, so ``emitted - scheduled`` is the sim's own lateness. Non-streaming
responses have no events.

How a stream ended, and when: ``"end": "done"`` (``[DONE]`` went out with the last content
event, at ``end_ns``), ``"error"`` (an ``{"error": ...}`` event and ``[DONE]`` were written at
``end_ns``, HTTP status still 200), ``"hang"`` (the stream went silent at ``end_ns`` with the
connection kept open) or ``"cut"`` (the connection ended without either: a crash, or the
client left; ``end_ns`` 0). A non-streaming response sent whole, whatever its status, is
``"done"`` when it was written.

Lines are buffered and written every ``flush_interval_s`` and at exit: writing a line per
request would put file I/O on the event loop between events.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TextIO

from simengine.protocol import dumps


@dataclass(slots=True)
class TruthRecord:
    """One request's ground truth, filled in while it is served."""

    request_id: str
    path: str
    arrival_ns: int
    read_ns: int = 0
    # 499 (nginx's "client closed request") until a response starts: a request abandoned
    # before any answer must not look like a success.
    status: int = 499
    emitted_ns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    scheduled_ns: list[int] = field(default_factory=list)
    end: str = "cut"
    end_ns: int = 0

    def ended(self, how: str, at_ns: int) -> None:
        self.end, self.end_ns = how, at_ns

    def add_event(self, emitted_ns: int, tokens: int, scheduled_ns: int) -> None:
        self.emitted_ns.append(emitted_ns)
        self.tokens.append(tokens)
        self.scheduled_ns.append(scheduled_ns)

    def to_json(self) -> str:
        events = ",".join(f"[{e},{n}]" for e, n in zip(self.emitted_ns, self.tokens, strict=True))
        scheduled = ",".join(map(str, self.scheduled_ns))
        return (
            f'{{"request_id":{dumps(self.request_id)},"path":{dumps(self.path)},'
            f'"status":{self.status},"arrival_ns":{self.arrival_ns},"read_ns":{self.read_ns},'
            f'"events":[{events}],"scheduled_ns":[{scheduled}],'
            f'"end":"{self.end}","end_ns":{self.end_ns}}}'
        )


class TruthLog:
    """Buffered JSONL writer; ``close`` (or ``flush``) must run before the process exits."""

    def __init__(
        self, path: str, *, flush_interval_s: float = 0.25, max_buffered: int = 4096
    ) -> None:
        self._file: TextIO = open(path, "w", encoding="utf-8")  # noqa: SIM115
        self._lines: list[str] = []
        self._interval = flush_interval_s
        self._max = max_buffered
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Flush periodically on the running event loop."""
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._interval, self._tick)

    def _tick(self) -> None:
        self.flush()
        self.start()

    def record(self, record: TruthRecord) -> None:
        self._lines.append(record.to_json())
        if len(self._lines) >= self._max:
            self.flush()

    def flush(self) -> None:
        if self._file.closed:
            return
        if self._lines:
            self._lines.append("")
            self._file.write("\n".join(self._lines))
            self._lines = []
        self._file.flush()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
        self._file.close()
