"""A small HTTP/1.1 server on ``asyncio.Protocol``.

Why not a framework: the sim must be listening within a fraction of a second of process start
and must push thousands of SSE events per second from one process, so it writes pre-encoded
chunks straight to the transport. What it supports is what LLM clients use: Content-Length and
chunked request bodies, ``Expect: 100-continue``, keep-alive with pipelined requests handled in
order, ``Connection: close``, HTTP/1.0, HEAD, and responses that are either sized (JSON) or
streamed with chunked transfer encoding. ``drain()`` waits out write back-pressure, but the
engine's streams never call it: a slow reader's bytes queue in its transport, so one slow
client cannot hold up a whole batch. A client that disconnects cancels the task serving it.
Connections end the ways real servers end them (:class:`ConnectionHabits`): after an idle
timeout, after a number of requests, announced in a ``Keep-Alive`` header or not.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus

from simengine import rxstamp

MAX_BODY_BYTES = 1 << 20
MAX_HEAD_BYTES = 64 * 1024
SERVER_NAME = "gate-sim"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    body: bytes
    # Monotonic-clock time the request's last bytes reached the host: the kernel's receive
    # stamp where the platform gives one (see rxstamp), else the same as read_ns. The sim's
    # ground truth counts from here.
    arrival_ns: int = 0
    # time.monotonic_ns() once the body was complete in the buffer (for pipelined requests:
    # when the connection got to it): read_ns - arrival_ns is the sim's own intake latency.
    read_ns: int = 0


@dataclass(frozen=True, slots=True)
class ConnectionHabits:
    """How the server ends kept-alive connections, after the two kinds of real server.

    ``idle_timeout_s``: a connection with no request in progress is closed this long after its
    last response (or its opening); any byte of a request stops the clock until the response
    is out, as uvicorn's ``timeout_keep_alive`` does. ``max_requests``: a connection serves at
    most this many requests.

    ``announce`` is cpp-httplib's way (llama.cpp's server): ``Keep-Alive: timeout=T, max=N``
    on every response (T in whole seconds, rounded down; N the limit, repeated), and
    ``Connection: close`` on the last response a connection may give, which closes it.
    Without it the server is silent, as uvicorn (vLLM's server) is: an idle connection is
    closed without notice, and a connection that has served its N requests stays open but
    closes, unanswered, on the next request that arrives: what a client sees when a server's
    close crosses its request on the wire, here every time, so a client must send again.
    """

    idle_timeout_s: float | None = None
    max_requests: int | None = None
    announce: bool = False

    def __post_init__(self) -> None:
        t = self.idle_timeout_s
        if t is not None and not (math.isfinite(t) and t > 0):
            raise ValueError(f"idle_timeout_s: must be a finite number > 0, got {t!r}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests: must be >= 1, got {self.max_requests!r}")

    def keep_alive_header(self) -> str | None:
        """The ``Keep-Alive`` value announced on a response that keeps its connection."""
        if not self.announce:
            return None
        params = []
        if self.idle_timeout_s is not None:
            params.append(f"timeout={math.floor(self.idle_timeout_s)}")
        if self.max_requests is not None:
            params.append(f"max={self.max_requests}")
        return ", ".join(params) or None


@dataclass(slots=True)
class ConnectionStats:
    """What the server's connection habits did, for /metrics and the log at exit."""

    opened: int = 0
    closed_idle: int = 0  # closed after the idle timeout
    closed_at_limit: int = 0  # closed having served max_requests
    dropped: int = 0  # requests closed unanswered on a connection that had served its limit

    def line(self) -> str:
        return (
            f"connections opened {self.opened}, closed idle {self.closed_idle}, closed at the "
            f"request limit {self.closed_at_limit}; requests closed unanswered {self.dropped}"
        )


class HttpError(Exception):
    """A request the server cannot even parse; answered with a bare status, then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True))
    return _date_cache[1]


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class Responder:
    """How a handler answers: ``send`` once, or ``start_stream``, ``write``..., ``end_stream``."""

    def __init__(
        self,
        protocol: HttpProtocol,
        request: Request,
        keep_alive: bool,
        announce: str | None = None,
    ) -> None:
        self._protocol = protocol
        self._head_only = request.method == "HEAD"
        self._http10 = request.version == "HTTP/1.0"
        self._announce = announce  # the Keep-Alive header's value, when the server says it
        self.keep_alive = keep_alive
        self.started = False
        self.finished = False
        self._chunked = False

    @property
    def closed(self) -> bool:
        return self._protocol.closed

    def _head(self, status: int, headers: Iterable[tuple[str, str]]) -> bytes:
        lines = [
            f"HTTP/1.1 {status} {_reason(status)}\r\n",
            f"date: {_http_date()}\r\nserver: {SERVER_NAME}\r\n",
        ]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers)
        if not self.keep_alive:
            lines.append("connection: close\r\n")
        else:
            if self._http10:
                lines.append("connection: keep-alive\r\n")
            if self._announce is not None:
                lines.append(f"keep-alive: {self._announce}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    def send(
        self,
        status: int,
        body: bytes = b"",
        *,
        content_type: str | None = "application/json",
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = self.finished = True
        all_headers = [*headers]
        if content_type is not None:
            all_headers.append(("content-type", content_type))
        all_headers.append(("content-length", str(len(body))))
        head = self._head(status, all_headers)
        self._protocol.write(head if self._head_only else head + body)

    def start_stream(
        self,
        status: int = 200,
        *,
        content_type: str = "text/event-stream; charset=utf-8",
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        all_headers = [*headers, ("content-type", content_type), ("cache-control", "no-cache")]
        if self._http10:
            # No chunked coding in HTTP/1.0: the end of the body is the end of the connection.
            self.keep_alive = False
        else:
            self._chunked = True
            all_headers.append(("transfer-encoding", "chunked"))
        self._protocol.write(self._head(status, all_headers))

    def write(self, data: bytes) -> None:
        if not data or self._head_only:
            return
        if self._chunked:
            self._protocol.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self._protocol.write(data)

    async def drain(self) -> None:
        await self._protocol.drain()

    def end_stream(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self._chunked and not self._head_only:
            self._protocol.write(b"0\r\n\r\n")

    def abort(self) -> None:
        """Cut the connection: a stream whose source broke off must not look complete."""
        self.finished = True
        self.keep_alive = False
        self._protocol.abort()


Handler = Callable[[Request, Responder], Awaitable[None]]


class HttpProtocol(asyncio.Protocol):
    """One connection. Requests are served one at a time; pipelined ones wait in the buffer."""

    def __init__(
        self,
        handler: Handler,
        connections: set[HttpProtocol],
        *,
        max_body: int = MAX_BODY_BYTES,
        habits: ConnectionHabits | None = None,
        stats: ConnectionStats | None = None,
    ) -> None:
        self._handler = handler
        self._connections = connections
        self._max_body = max_body
        self._habits = habits or ConnectionHabits()
        self._announce = self._habits.keep_alive_header()
        self._stats = stats or ConnectionStats()
        self._served = 0  # responses this connection has given
        self._spent = False  # served its limit, silently: the next request is not answered
        self._idle: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self._sent_continue = False
        self._eof = False
        self._fd = -1
        self.closed = False

    # -- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.add(self)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        self._stats.opened += 1
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._connections.discard(self)
        self._disarm_idle()
        self._writable.set()
        if self._task is not None and not self._task.done():
            # The client is gone: stop generating for it (vLLM aborts the request too).
            self._task.cancel()

    def data_received(self, data: bytes) -> None:
        self._disarm_idle()  # a request is coming: the idle clock stops until it is answered
        self._buffer += data
        if self._task is None:
            self._process()
        elif len(self._buffer) > self._max_body + MAX_HEAD_BYTES and not self._reading_paused:
            assert self._transport is not None
            self._transport.pause_reading()
            self._reading_paused = True

    def eof_received(self) -> bool:
        self._eof = True
        if self._task is None:
            self._process()
            if self._task is None:
                return False  # nothing in flight: let the transport close
        return True  # keep the write side open until the response is out

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task serving the current request, if any."""
        return self._task

    # -- used by Responder -------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def drain(self) -> None:
        if not self._writable.is_set():
            await self._writable.wait()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # -- connection habits -------------------------------------------------------------------

    def _arm_idle(self) -> None:
        timeout = self._habits.idle_timeout_s
        if timeout is not None and not self.closed and self._task is None:
            self._disarm_idle()
            self._idle = asyncio.get_running_loop().call_later(timeout, self._idle_expired)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        if self.closed or self._task is not None or self._transport is None:
            return
        self._stats.closed_idle += 1
        self._transport.close()

    # -- request parsing ---------------------------------------------------------------------

    def _process(self) -> None:
        if self.closed or self._task is not None:
            return
        if self._spent and self._buffer.strip(b"\r\n"):
            # A request on a connection that has served its limit: closed unanswered.
            self._stats.dropped += 1
            self._stats.closed_at_limit += 1
            self._buffer.clear()
            if self._transport is not None:
                self._transport.close()
            return
        try:
            parsed = self._parse_one()
        except HttpError as exc:
            self._reject(exc.status, exc.message)
            return
        if parsed is None:
            if self._eof and self._transport is not None:
                self._transport.close()
            return
        request, keep_alive = parsed
        if self._reading_paused and self._transport is not None:
            self._transport.resume_reading()
            self._reading_paused = False
        self._task = asyncio.get_running_loop().create_task(self._serve(request, keep_alive))

    def _parse_one(self) -> tuple[Request, bool] | None:
        buf = self._buffer
        while buf.startswith(b"\r\n"):  # tolerated between pipelined requests
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise HttpError(431, "Request header fields too large")
            return None
        if end > MAX_HEAD_BYTES:
            raise HttpError(431, "Request header fields too large")
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            raise HttpError(400, "Malformed request line") from None
        if not method.isalpha() or not method.isupper() or not target:
            raise HttpError(400, "Malformed request line")
        if not version.startswith("HTTP/"):
            raise HttpError(400, "Malformed request line")
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise HttpError(505, "HTTP version not supported")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or line[0] in " \t":
                raise HttpError(400, "Malformed header line")
            key = name.lower()
            value = value.strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value

        body_start = end + 4
        transfer_encoding = headers.get("transfer-encoding")
        if transfer_encoding is not None:
            if "content-length" in headers:
                raise HttpError(400, "Both Content-Length and Transfer-Encoding")
            if transfer_encoding.lower() != "chunked":
                raise HttpError(501, "Unsupported transfer coding")
            decoded = self._decode_chunked(body_start, headers)
            if decoded is None:
                return None
            body, consumed = decoded
        else:
            length_text = headers.get("content-length", "0")
            if not length_text.isdigit():
                raise HttpError(400, "Invalid Content-Length")
            length = int(length_text)
            if length > self._max_body:
                raise HttpError(413, "Request body too large")
            if len(buf) < body_start + length:
                self._maybe_continue(headers, version)
                return None
            body = bytes(buf[body_start : body_start + length])
            consumed = body_start + length
        del buf[:consumed]
        self._sent_continue = False

        connection = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in connection
        else:
            keep_alive = "close" not in connection
        path, _, query = target.partition("?")
        read_ns = time.monotonic_ns()
        arrival_ns = min(rxstamp.last_rx_ns(self._fd) or read_ns, read_ns)
        request = Request(method, target, path, query, version, headers, body, arrival_ns, read_ns)
        return request, keep_alive

    def _maybe_continue(self, headers: dict[str, str], version: str) -> None:
        if (
            not self._sent_continue
            and version == "HTTP/1.1"
            and headers.get("expect", "").lower() == "100-continue"
        ):
            self._sent_continue = True
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _decode_chunked(self, start: int, headers: dict[str, str]) -> tuple[bytes, int] | None:
        """Decode a complete chunked body from the buffer, or return None if more is needed."""
        buf = self._buffer
        pos = start
        body = bytearray()
        while True:
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                if len(buf) - pos > 1024:
                    raise HttpError(400, "Malformed chunk size")
                self._maybe_continue(headers, "HTTP/1.1")
                return None
            size_text = bytes(buf[pos:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(400, "Malformed chunk size") from None
            if size < 0:
                raise HttpError(400, "Malformed chunk size")
            if len(body) + size > self._max_body:
                raise HttpError(413, "Request body too large")
            pos = line_end + 2
            if size == 0:
                # Trailer section: header lines until an empty line.
                while True:
                    trailer_end = buf.find(b"\r\n", pos)
                    if trailer_end < 0:
                        return None
                    if trailer_end == pos:
                        return bytes(body), pos + 2
                    pos = trailer_end + 2
            if len(buf) < pos + size + 2:
                self._maybe_continue(headers, "HTTP/1.1")
                return None
            if buf[pos + size : pos + size + 2] != b"\r\n":
                raise HttpError(400, "Malformed chunk")
            body += buf[pos : pos + size]
            pos += size + 2

    def _reject(self, status: int, message: str) -> None:
        err_type = (
            "BadRequestError" if status == 400 else _reason(status).replace(" ", "") + "Error"
        )
        error = {"message": message, "type": err_type, "param": None, "code": status}
        body = json.dumps({"error": error}, separators=(",", ":")).encode()
        head = (
            f"HTTP/1.1 {status} {_reason(status)}\r\ndate: {_http_date()}\r\n"
            f"server: {SERVER_NAME}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode("latin-1")
        self.write(head + body)
        self._buffer.clear()
        if self._transport is not None:
            self._transport.close()

    # -- serving -----------------------------------------------------------------------------

    async def _serve(self, request: Request, keep_alive: bool) -> None:
        limit = self._habits.max_requests
        last = limit is not None and self._served + 1 >= limit
        if last and self._habits.announce:
            keep_alive = False  # said on this response: connection: close
        responder = Responder(self, request, keep_alive and not self._eof, self._announce)
        try:
            await self._handler(request, responder)
            if not responder.started:
                responder.send(500, b'{"error":{"message":"no response","code":500}}')
            responder.end_stream()
        except asyncio.CancelledError:
            # Only this module cancels the task (disconnect or shutdown): nobody to answer.
            self.abort()
            return
        except Exception:
            traceback.print_exc(file=sys.stderr)
            if responder.started:
                self.abort()  # a truncated stream must not look complete
                return
            responder.keep_alive = False
            responder.send(
                500,
                b'{"error":{"message":"Internal server error","type":"InternalServerError",'
                b'"param":null,"code":500}}',
            )
        finally:
            self._task = None
            self._served += 1
        if not responder.keep_alive or self._eof:
            if last and self._habits.announce:
                self._stats.closed_at_limit += 1
            if self._transport is not None:
                self._transport.close()
            return
        self._spent = last
        self._process()
        self._arm_idle()  # a no-op when a pipelined request is being served


async def start_server(
    handler: Handler,
    sock: socket.socket,
    connections: set[HttpProtocol],
    *,
    max_body: int = MAX_BODY_BYTES,
    habits: ConnectionHabits | None = None,
    stats: ConnectionStats | None = None,
) -> asyncio.Server:
    """Serve on an already bound socket, so a caller asking for port 0 knows the port first."""
    loop = asyncio.get_running_loop()
    shared = stats or ConnectionStats()
    return await loop.create_server(
        lambda: HttpProtocol(handler, connections, max_body=max_body, habits=habits, stats=shared),
        sock=sock,
        backlog=2048,
    )


async def cut_connections(server: asyncio.Server, connections: set[HttpProtocol]) -> None:
    """Stop listening and abort every connection, then give the aborted handlers a second to
    finish (what they write on the way out, ground truth for one, still lands)."""
    server.close()
    handlers = [t for c in connections if (t := c.task) is not None]
    for connection in list(connections):
        connection.abort()
    if handlers:
        await asyncio.wait(handlers, timeout=1.0)
