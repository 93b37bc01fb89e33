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
"""

from __future__ import annotations

import re
from typing import NamedTuple

DONE = "[DONE]"
"""The data OpenAI-compatible servers send as the last event of a stream."""

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"


class ServerSentEvent(NamedTuple):
    """One dispatched event; a tuple so that building one per streamed token stays cheap."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Turns a byte stream into events; one instance per response, not reusable."""

    __slots__ = ("_bom_checked", "_buf", "_data", "_event", "_has_data", "_last_id", "_retry")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._bom_checked = False
        self._data: list[str] = []
        self._has_data = False
        self._event = ""
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Consume one read; returns the events it completed, in order."""
        if not chunk:
            return []
        buf = self._buf
        buf += chunk
        if not self._bom_checked:
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                return []  # could still be a split BOM
            if buf.startswith(_BOM):
                del buf[: len(_BOM)]
            self._bom_checked = True
        if b"\r" in buf:
            return self._drain(final=False)
        return self._drain_lf()

    def close(self) -> list[ServerSentEvent]:
        """End of stream: dispatch a pending event that only lacked its blank line."""
        events = self._drain(final=True)
        self._buf.clear()  # an unterminated last line may be a cut; drop it
        if self._has_data:
            events.append(self._dispatch())
        return events

    def _drain(self, *, final: bool) -> list[ServerSentEvent]:
        buf = self._buf
        if b"\r" not in buf:
            return self._drain_lf()
        events: list[ServerSentEvent] = []
        end = len(buf)
        pos = 0
        while True:
            m = _EOL.search(buf, pos)
            if m is None:
                break
            if not final and m.end() == end and m.group() == b"\r":
                break  # a CR at the very end may be the first half of CRLF
            line = bytes(buf[pos : m.start()])
            pos = m.end()
            event = self._line(line)
            if event is not None:
                events.append(event)
        if pos:
            del buf[:pos]
        return events

    def _drain_lf(self) -> list[ServerSentEvent]:
        """The common framing (LF only) without a regex: split off every complete line at
        once and handle ``data:`` and blank lines inline; anything else goes to ``_line``."""
        buf = self._buf
        last = buf.rfind(b"\n")
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
        return events

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
