"""An incremental Server-Sent Events parser that is fed bytes exactly as the socket yields them.

Why not parse ``response.aiter_lines()``: we timestamp every socket read, so the parser must
accept arbitrary byte boundaries (an event, a line, even a UTF-8 character split across reads)
and hand back each event as soon as its terminating blank line arrives, not later. It is pure
(no I/O, no clock) so the timing layer stays in ``client`` and the parser can be tested
exhaustively.

It follows the WHATWG ``text/event-stream`` rules: lines end in CRLF, LF or a lone CR; lines
starting with ``:`` are comments (servers use them as keep-alives); ``data`` fields accumulate
with ``\\n`` between them; one leading space after the colon is dropped; a blank line dispatches
the event, and a blank line with no ``data`` dispatches nothing. ``[DONE]`` is ordinary data
here: recognising the OpenAI terminator is the client's business.

One deliberate leniency: at :meth:`SSEParser.close` an event whose lines are complete but which
lacks the final blank line is still dispatched (WHATWG discards it), because some servers close
right after the last ``data:`` line. A trailing line without its line break is discarded: it
cannot be told apart from a stream cut mid-line.

Bounded, because the bytes come from an engine under test: a line may hold at most
:data:`MAX_SSE_LINE_BYTES` and an event :data:`MAX_SSE_EVENT_BYTES`, past which :meth:`feed`
raises :class:`SSELimitError`; and each byte is scanned for line breaks once, so a line that
arrives a byte at a time costs linear, not quadratic, time.
"""

from __future__ import annotations

import re
from typing import NamedTuple

DONE = "[DONE]"
"""The data OpenAI-compatible servers send as the last event of a stream."""

MAX_SSE_LINE_BYTES = 1 << 20
"""The longest unfinished line (1 MiB) the parser holds from one read to the next.

An engine that never ends a line would otherwise grow the buffer, and the client's memory,
for as long as it keeps sending; the largest real events (a chunk of tokens with top-20
logprobs) are tens of KiB. Checked once per read, an integer comparison: what a single read
brings is bounded by the read itself."""

MAX_SSE_EVENT_BYTES = 1 << 20
"""The most bytes (1 MiB) of lines an unfinished event may span from one read to the next,
counted from the blank line before it once it holds data: ``data:`` lines without the blank
line that dispatches them would otherwise accumulate without end. Checked at the end of a
read only when an event is left open by it, which a token stream's reads rarely do."""

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


class SSELimitError(ValueError):
    """The stream broke one of the parser's size limits; the message names the limit.

    The parser is unusable afterwards: the response it was reading must be abandoned."""


class ServerSentEvent(NamedTuple):
    """One dispatched event; a tuple so that building one per streamed token stays cheap."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Turns a byte stream into events; one instance per response, not reusable."""

    __slots__ = (
        "_bom_checked",
        "_buf",
        "_data",
        "_event",
        "_has_data",
        "_last_id",
        "_open",
        "_retry",
    )

    def __init__(self) -> None:
        self._buf = bytearray()
        self._bom_checked = False
        self._data: list[str] = []
        self._has_data = False
        self._open = 0  # bytes of lines the pending event spans, counted at the end of a read
        self._event = ""
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Consume one read; returns the events it completed, in order.

        Raises :class:`SSELimitError` once a line or an event outgrows its limit."""
        if not chunk:
            return []
        buf = self._buf
        # What is left from earlier reads was scanned then: it holds no line break, except
        # a CR at its very end (the first half of a CRLF, perhaps). Only new bytes are
        # scanned, so a line sent a byte at a time costs linear time.
        scanned = len(buf)
        buf += chunk
        if not self._bom_checked:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                return []  # could still be a split BOM
            if buf.startswith(_BOM):
                del buf[: len(_BOM)]
            scanned = 0
            self._bom_checked = True
        if scanned and buf[scanned - 1] == 0x0D:
            events = self._drain(scanned - 1, final=False)
        elif 0x0D in chunk:  # an int, not b"\r": a plain memchr, ~9x cheaper per read
            events = self._drain(scanned, final=False)
        else:
            events = self._drain_lf(scanned)
        if len(buf) > MAX_SSE_LINE_BYTES:
            raise SSELimitError(
                f"an SSE line grew past MAX_SSE_LINE_BYTES ({MAX_SSE_LINE_BYTES} bytes) "
                "without a line break"
            )
        return events

    def close(self) -> list[ServerSentEvent]:
        """End of stream: dispatch a pending event that only lacked its blank line."""
        events = self._drain(0, final=True) if 0x0D in self._buf else self._drain_lf(0)
        self._buf.clear()  # an unterminated last line may be a cut; drop it
        if self._has_data:
            events.append(self._dispatch())
        return events

    def _drain(self, scan_from: int, *, final: bool) -> list[ServerSentEvent]:
        """Split off every complete line, any framing (the buffer holds a CR);
        ``buf[:scan_from]`` holds no line break."""
        buf = self._buf
        events: list[ServerSentEvent] = []
        end = len(buf)
        pos = 0
        blank = -1  # where the last blank line ended
        m = _EOL.search(buf, scan_from)
        while m is not None:
            if not final and m.end() == end and m.group() == b"\r":
                break  # a CR at the very end may be the first half of CRLF
            line = bytes(buf[pos : m.start()])
            pos = m.end()
            if not line:
                blank = pos
            event = self._line(line)
            if event is not None:
                events.append(event)
            m = _EOL.search(buf, pos)
        if pos:
            del buf[:pos]
        if self._has_data:
            self._count_open(pos - blank if blank >= 0 else self._open + pos)
        elif self._open:
            self._open = 0
        return events

    def _drain_lf(self, scan_from: int) -> list[ServerSentEvent]:
        """The common framing (LF only) without a regex: split off every complete line at
        once and handle ``data:`` and blank lines inline; anything else goes to ``_line``."""
        buf = self._buf
        last = buf.rfind(b"\n", scan_from)
        if last < 0:
            return []
        lines = bytes(buf[:last]).split(b"\n")
        del buf[: last + 1]
        events: list[ServerSentEvent] = []
        for raw in lines:
            if not raw:
                if self._has_data:
                    events.append(self._dispatch())
                else:
                    self._event = ""
            elif raw.startswith(b"data: "):
                self._data.append(raw[6:].decode("utf-8", errors="replace"))
                self._has_data = True
            else:
                event = self._line(raw)
                if event is not None:
                    events.append(event)
        # Once per read, and only when an event stays open past it (rare in a token stream,
        # whose reads end at event boundaries): nothing is added per line or per event.
        if self._has_data:
            size = 0
            for raw in reversed(lines):
                if not raw:
                    break
                size += len(raw) + 1
            else:
                size += self._open  # no blank line in this read: the event began earlier
            self._count_open(size)
        elif self._open:
            self._open = 0
        return events

    def _count_open(self, size: int) -> None:
        self._open = size
        if size > MAX_SSE_EVENT_BYTES:
            raise SSELimitError(
                f"an SSE event grew past MAX_SSE_EVENT_BYTES ({MAX_SSE_EVENT_BYTES} bytes) "
                "without the blank line that ends it"
            )

    def _line(self, raw: bytes) -> ServerSentEvent | None:
        if not raw:
            if self._has_data:
                return self._dispatch()
            self._event = ""
            return None
        if raw[0] == 0x3A:  # ':' comment / keep-alive
            return None
        line = raw.decode("utf-8", errors="replace")
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent:
        data = self._data
        event = ServerSentEvent(
            data[0] if len(data) == 1 else "\n".join(data),
            self._event or "message",
            self._last_id,
            self._retry,
        )
        self._data = []
        self._has_data = False
        self._event = ""
        return event
