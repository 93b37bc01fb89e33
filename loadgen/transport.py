"""A lean HTTP/1.1 transport for httpx, built for measuring many concurrent token streams.

Why it exists: with httpx's default transport (httpcore over anyio, h11 for parsing) one
streamed event costs ~130 us of client CPU, nearly all of it in the layers between the socket
and our SSE parser, and a shared pool scans every connection on each request. A load generator
that burns that much CPU per token measures its own queueing instead of the engine. This
transport keeps httpx as the client (request building, headers, timeouts, the exception
hierarchy, ``client.stream``) and replaces only the wire layer:

- an ``asyncio.Protocol`` per connection decodes the response framing (content-length,
  chunked, or read-to-close) inside ``data_received``, so one socket read becomes one queued
  body piece with no intermediate byte copies, parser objects or anyio wrappers;
- each piece carries the receive stamp of the read that delivered it: the kernel's
  (``SO_TIMESTAMPNS``, moved to the monotonic clock) where the platform gives one, else
  ``time.monotonic_ns()`` taken before any parsing; the instant the request bytes were handed
  to the kernel is kept as well; both are exposed through the response's
  ``extensions["loadgen.tap"]`` (a :class:`StreamTap`) so the client times the network, not
  its own event loop's backlog;
- a request may carry the ``loadgen.send_at_ns`` extension (:data:`SEND_AT`): it is built and
  given a connection at once, and its bytes are written at that instant from a precise timer
  (:mod:`loadgen.clock`), so the send is on time even though asyncio's timers are not;
- the pool is a list of idle connections per origin plus a FIFO of waiters: O(1) per request,
  with explicit limits and a pool timeout that raises ``httpx.PoolTimeout`` as httpx does.

Scope, deliberately narrow: plain-http HTTP/1.1 only (``make_client`` keeps httpx's default
transport for https), no proxies, no HTTP/2, no request pipelining. Errors are httpx's own
exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``PoolTimeout``,
``RemoteProtocolError``, ``ReadError``), so callers handle both transports the same way.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import httpx

from loadgen.clock import PreciseTimer

_MAX_HEAD = 64 * 1024
"""Refuse response heads (and trailer lines) larger than this: a server streaming garbage must
not eat memory."""

_Origin = tuple[str, int]
_DRAIN_S = 1.0
# An idle connection is retired this long before the idle timeout its server announced.
_CLOSE_MARGIN_S = 1.0


SEND_AT = "loadgen.send_at_ns"
"""Request extension: the ``time.monotonic_ns()`` instant the request's bytes should leave.

The request is built, a connection taken (or opened) and the bytes queued now; only the socket
write waits, on a precise timer (:mod:`loadgen.clock`). A request whose instant has passed goes
at once. ``sent_ns`` is still the instant of the write."""


Sink = Callable[[bytes, int], bool]
"""Receives each body piece with its receive stamp; returns False once it wants no more."""


class StreamTap:
    """One exchange's response body and timestamps, for a consumer that wants them directly.

    ``sent_ns`` is the instant the request was written to the socket; ``last_ns`` is the
    receive stamp of the body piece most recently handed on. :meth:`consume` is the lean way
    to read a body: pieces go to a callback from one scheduled callback per event-loop pass
    (after every ready socket has been read and stamped), with no task switch, future or
    async-generator layer per piece. Iterating the httpx response instead also works; both
    see the same pieces and stamps.
    """

    __slots__ = (
        "_dispatcher",
        "_done",
        "_error",
        "_finished",
        "_head",
        "_last_rx_ns",
        "_pieces",
        "_queued",
        "_sink",
        "_stopped",
        "_waiter",
        "last_ns",
        "sent_ns",
    )

    def __init__(self, dispatcher: _Dispatcher) -> None:
        loop = asyncio.get_running_loop()
        self._head: asyncio.Future[tuple[int, bytes, list[tuple[bytes, bytes]]]] = (
            loop.create_future()
        )
        self._dispatcher = dispatcher
        self._pieces: collections.deque[tuple[bytes, int]] = collections.deque()
        self._done = False
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None
        self._finished: asyncio.Future[None] | None = None
        self._stopped = False
        self._queued = False
        self._last_rx_ns = 0
        self.sent_ns = 0
        self.last_ns = 0

    @property
    def complete(self) -> bool:
        """The whole body arrived and was handed on: the connection can be reused."""
        return self._done and self._error is None and not self._pieces

    async def consume(self, sink: Sink, *, read_timeout: float | None, drain_s: float) -> None:
        """Hand every body piece to ``sink`` until the body ends or ``sink`` returns False.

        Raises the httpx error that ended the body early (``ReadTimeout`` after
        ``read_timeout`` seconds without a byte). Once the sink has stopped, the rest of the
        body is awaited for at most ``drain_s`` seconds and discarded, so a finished
        connection can be reused; errors after the stop are ignored.
        """
        loop = asyncio.get_running_loop()
        self._sink = sink
        self._finished = finished = loop.create_future()
        self._pump()
        timer = None
        if not finished.done() and read_timeout is not None:
            timer = loop.call_later(read_timeout, self._watchdog, read_timeout)
        try:
            await finished
        finally:
            self._sink = None
            if timer is not None:
                timer.cancel()

    def _watchdog(self, read_timeout: float) -> None:
        finished = self._finished
        if finished is None or finished.done():
            return
        loop = asyncio.get_running_loop()
        if self._stopped:
            finished.set_result(None)  # drained long enough; aclose drops the connection
            return
        idle_s = (time.monotonic_ns() - self._last_rx_ns) / 1e9
        if idle_s >= read_timeout:
            finished.set_exception(httpx.ReadTimeout(f"no data for {read_timeout:g} s"))
        else:
            loop.call_later(read_timeout - idle_s, self._watchdog, read_timeout)

    def _pump(self) -> None:
        """Deliver queued pieces to the sink and settle ``consume`` when the body is over."""
        sink = self._sink
        finished = self._finished
        if sink is None or finished is None or finished.done():
            return
        pieces = self._pieces
        while pieces and not self._stopped:
            data, self.last_ns = pieces.popleft()
            try:
                keep = sink(data, self.last_ns)
            except BaseException as exc:  # a bug in the sink: surface it in the consumer
                finished.set_exception(exc)
                return
            if not keep:
                self._stopped = True
                pieces.clear()
                if not self._done:
                    loop = asyncio.get_running_loop()
                    loop.call_later(_DRAIN_S, self._watchdog, _DRAIN_S)
        if self._stopped:
            pieces.clear()
            if self._done:
                finished.set_result(None)
        elif self._done:
            if self._error is not None:
                finished.set_exception(self._error)
            else:
                finished.set_result(None)

    def _wake(self) -> None:
        if self._sink is not None:
            if not self._queued:
                self._queued = True
                self._dispatcher.schedule(self)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Dispatcher:
    """Runs the sinks of every tap that received data, once per event-loop pass.

    Deferring the parsing to one callback scheduled with ``call_soon`` lets the loop read and
    stamp every ready socket first: parsing inside ``data_received`` would delay the stamps
    of the sockets read after it in the same pass.
    """

    def __init__(self) -> None:
        self._pending: list[StreamTap] = []
        self._scheduled = False

    def schedule(self, tap: StreamTap) -> None:
        self._pending.append(tap)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        for tap in pending:
            tap._queued = False
            tap._pump()


# Body framing states.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _TO_CLOSE, _IDLE = range(8)


_READ_SIZE = 64 * 1024


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection carrying at most one exchange at a time.

    A buffered protocol, because asyncio's plain ``Protocol`` reads each time into a fresh
    256 KiB bytes object: above glibc's mmap threshold, so every read of a 300-byte event
    cost an mmap/munmap pair, the largest single client cost per streamed token.
    """

    def __init__(self, pool: _Pool, origin: _Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.sock: _StampedSocket | None = None
        self.closed = False
        self.reusable = True
        self.holds_slot = True
        self.idle_since = 0.0
        self.exchange: StreamTap | None = None
        self._buf = b""  # undecoded bytes left over from the previous read
        self._read = bytearray(_READ_SIZE)
        self._view = memoryview(self._read)
        self._state = _IDLE
        self._remaining = 0
        self._head_only = False
        self.served = 0  # responses whose head arrived on this connection
        self.max_requests: int | None = None  # what the server's Keep-Alive max allows
        self.idle_timeout: float | None = None  # what the server's Keep-Alive timeout says
        self.got_bytes = False  # any byte of the current exchange's answer arrived

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: other loops (uvloop) have transports of their own classes.
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        now = time.monotonic_ns()  # first, so parsing never delays the stamp
        sock = self.sock
        if sock is not None and 0 < sock.rx_ns < now:
            now = sock.rx_ns  # when the bytes reached the host, not when the loop read them
        self._received(self._view[:nbytes].tobytes(), now)

    def _received(self, data: bytes, now: int) -> None:
        self.got_bytes = True
        if self._state == _IDLE or self.exchange is None:
            self.abort()  # bytes nobody asked for: the connection is in an unknown state
            return
        try:
            self._feed(data, now)
        except httpx.RemoteProtocolError as exc:
            self._fail(exc)
            self.abort()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost decides what the EOF meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        exchange = self.exchange
        if exchange is not None and not exchange._done:
            if self._state == _TO_CLOSE and exc is None:
                self._finish()  # a body delimited by the close: this is its end
            else:
                if self._state == _HEAD:
                    message = "server disconnected without sending a response"
                else:
                    message = "peer closed connection without sending complete message body"
                self._fail(
                    httpx.ReadError(f"{message}: {exc}")
                    if exc
                    else httpx.RemoteProtocolError(message)
                )
        self.pool.return_slot(self)

    # -- sending -------------------------------------------------------------------------

    def send(self, data: bytes, head_only: bool, at_ns: int | None = None) -> StreamTap:
        """Start an exchange; with ``at_ns`` the bytes leave at that instant (armed on the
        pool's precise timer), everything else about the request being ready now."""
        assert self.transport is not None
        exchange = StreamTap(self.pool.dispatcher)
        self.exchange = exchange
        self.got_bytes = False
        self._state = _HEAD
        self._head_only = head_only
        self._buf = b""
        if at_ns is not None and at_ns > time.monotonic_ns():
            exchange._last_rx_ns = at_ns  # the read timeout counts from the send
            self.pool.timer().call_at_ns(at_ns, lambda: self._write(exchange, data))
        else:
            self._write(exchange, data)
        return exchange

    def _write(self, exchange: StreamTap, data: bytes) -> None:
        if self.closed or self.exchange is not exchange or self.transport is None:
            return  # aborted while armed: the exchange has failed already
        self.transport.write(data)
        # asyncio writes to the socket at once when its buffer is empty, so this is the
        # instant the request reached the kernel.
        exchange.sent_ns = exchange._last_rx_ns = time.monotonic_ns()

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.transport.abort()

    # -- decoding ------------------------------------------------------------------------

    def _fast_feed(self, data: bytes, now: int, exchange: StreamTap) -> bool:
        """The fast paths of `_feed` for an empty buffer; True when `data` was taken whole."""
        state = self._state
        # Fast paths for the common streaming reads. The first: one whole chunk of a
        # chunked body, the shape of nearly every read of a token stream.
        if state == _CHUNK_SIZE:
            i = data.find(b"\r\n")
            if 0 < i < 10:
                try:
                    size = int(data[:i], 16)
                except ValueError:
                    size = 0
                j = i + 2 + size
                if size > 0 and len(data) == j + 2 and data.endswith(b"\r\n"):
                    exchange._pieces.append((data[i + 2 : j], now))
                    exchange._wake()
                    return True
        elif state == _TO_CLOSE:
            exchange._pieces.append((data, now))
            exchange._wake()
            return True
        if state == _LENGTH and len(data) <= self._remaining:
            self._remaining -= len(data)
            exchange._pieces.append((data, now))
            if self._remaining == 0:
                self._finish()
            exchange._wake()
            return True
        return False

    def _feed(self, data: bytes, now: int) -> None:
        exchange = self.exchange
        assert exchange is not None
        exchange._last_rx_ns = now
        if not self._buf and self._fast_feed(data, now, exchange):
            return
        state = self._state
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        end = len(buf)
        while pos < end and state != _IDLE:
            if state == _CHUNK_SIZE:
                stop = buf.find(b"\n", pos)
                if stop < 0:
                    if end - pos > 1024:
                        raise httpx.RemoteProtocolError("chunk size line too long")
                    break
                size = _chunk_size(buf[pos:stop])
                pos = stop + 1
                if size == 0:
                    state = _TRAILER
                else:
                    self._remaining = size
                    state = _CHUNK_DATA
            elif state in (_CHUNK_DATA, _LENGTH):
                take = min(self._remaining, end - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    state = _IDLE if state == _LENGTH else _CHUNK_END
            elif state == _CHUNK_END:
                if buf[pos] == 0x0A:  # a bare LF, tolerated
                    pos += 1
                elif end - pos < 2:
                    break
                elif buf[pos : pos + 2] == b"\r\n":
                    pos += 2
                else:
                    raise httpx.RemoteProtocolError("chunk data not followed by CRLF")
                state = _CHUNK_SIZE
            elif state == _HEAD:
                stop, skip = _find_blank_line(buf, pos)
                if stop < 0:
                    if end - pos > _MAX_HEAD:
                        raise httpx.RemoteProtocolError("response head too large")
                    break
                state = self._head(buf[pos:stop])
                pos = stop + skip
            elif state == _TRAILER:
                stop = buf.find(b"\n", pos)
                if stop < 0:
                    if end - pos > _MAX_HEAD:
                        raise httpx.RemoteProtocolError("trailer line too long")
                    break
                blank = not buf[pos:stop].rstrip(b"\r")
                pos = stop + 1
                if blank:
                    state = _IDLE
            else:  # _TO_CLOSE
                out.append(buf[pos:end])
                pos = end
        self._buf = buf[pos:] if pos < end else b""
        if out:
            exchange._pieces.append((out[0] if len(out) == 1 else b"".join(out), now))
        if state == _IDLE:
            if self._buf:
                self.reusable = False  # more bytes than one response: unknown state
                self._buf = b""
            self._finish()
        else:
            self._state = state
        exchange._wake()

    def _head(self, raw: bytes) -> int:
        """Parse a response head; returns the framing state of the body that follows."""
        exchange = self.exchange
        assert exchange is not None
        lines = raw.replace(b"\r\n", b"\n").split(b"\n")
        status_line = lines[0]
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(f"bad status line {status_line[:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200 and status != 101:
            return _HEAD  # informational; the real response follows
        headers: list[tuple[bytes, bytes]] = []
        chunked = False
        length: int | None = None
        close = parts[0] == b"HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name.strip():
                raise httpx.RemoteProtocolError(f"bad header line {line[:80]!r}")
            name = name.strip()
            value = value.strip()
            headers.append((name, value))
            lower = name.lower()
            if lower == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            elif lower == b"content-length":
                if not value.isdigit():
                    raise httpx.RemoteProtocolError(f"bad content-length {value[:40]!r}")
                length = int(value)
            elif lower == b"connection":
                tokens = value.lower()
                if b"close" in tokens:
                    close = True
                elif b"keep-alive" in tokens:
                    close = False
            elif lower == b"keep-alive":
                self._keep_alive(value)
        self.served += 1
        if close or (self.max_requests is not None and self.served >= self.max_requests):
            self.reusable = False
        if not exchange._head.done():
            exchange._head.set_result((status, parts[2] if len(parts) > 2 else b"", headers))
        if self._head_only or status in (204, 304):
            return _IDLE
        if chunked:
            return _CHUNK_SIZE
        if length is not None:
            if length == 0:
                return _IDLE
            self._remaining = length
            return _LENGTH
        self.reusable = False
        return _TO_CLOSE

    def _keep_alive(self, value: bytes) -> None:
        """RFC 9112 appendix C.2.2's ``Keep-Alive: timeout=5, max=100``. ``max`` is read as
        the requests left counting this one: servers that count down (Apache) and servers
        that repeat their limit (cpp-httplib, in llama.cpp) then give the same bound."""
        for param in value.split(b","):
            key, _, num = param.strip().partition(b"=")
            key, num = key.strip().lower(), num.strip()
            if not num.isdigit() or len(num) > 9:
                continue  # not a count of seconds or requests ("inf", "-1", "5.5"): no bound
            n = int(num)
            if key == b"timeout":
                self.idle_timeout = n if self.idle_timeout is None else min(self.idle_timeout, n)
            elif key == b"max":
                bound = self.served + n
                self.max_requests = (
                    bound if self.max_requests is None else min(self.max_requests, bound)
                )

    def _finish(self) -> None:
        self._state = _IDLE
        exchange = self.exchange
        if exchange is not None and not exchange._done:
            exchange._done = True
            exchange._wake()

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        exchange = self.exchange
        if exchange is None or exchange._done:
            return
        if not exchange._head.done():
            exchange._head.set_exception(exc)
            exchange._head.exception()  # mark retrieved: the caller may have been cancelled
        exchange._error = exc
        exchange._done = True
        exchange._wake()


def _chunk_size(line: bytes) -> int:
    try:
        size = int(line, 16)  # int() strips the CR and other whitespace itself
    except ValueError:
        try:
            size = int(line.split(b";", 1)[0], 16)  # a chunk extension
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad chunk size {line[:40]!r}") from None
    if size < 0:
        raise httpx.RemoteProtocolError("negative chunk size")
    return size


def _find_blank_line(buf: bytes, pos: int) -> tuple[int, int]:
    """Where the head ends and how long its terminator is; servers send CRLF, a few LF."""
    crlf = buf.find(b"\r\n\r\n", pos)
    lf = buf.find(b"\n\n", pos)
    if lf >= 0 and (crlf < 0 or lf < crlf):
        return lf, 2
    return crlf, 4


class _Body(httpx.AsyncByteStream):
    """The response body: yields pieces as the protocol queues them, each with its stamp."""

    def __init__(
        self, pool: _Pool, conn: _Connection, exchange: StreamTap, read_timeout: float | None
    ) -> None:
        self._pool = pool
        self._conn = conn
        self._exchange = exchange
        self._read_timeout = read_timeout
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        exchange = self._exchange
        pieces = exchange._pieces
        read_timeout = self._read_timeout
        loop = asyncio.get_running_loop()
        while True:
            if pieces:
                data, exchange.last_ns = pieces.popleft()
                yield data
                continue
            if exchange._done:
                if exchange._error is not None:
                    raise exchange._error
                return
            waiter = loop.create_future()
            exchange._waiter = waiter
            timer = None
            if read_timeout is not None:
                timer = loop.call_later(read_timeout, _expire, waiter, read_timeout)
            try:
                await waiter
            finally:
                exchange._waiter = None
                if timer is not None:
                    timer.cancel()

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        if not self._exchange._done or self._exchange._pieces:
            self._conn.abort()  # closed mid-response: the connection cannot be reused
        self._pool.release(self._conn)


def _expire(waiter: asyncio.Future[None], seconds: float) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout(f"no data for {seconds:g} s"))


class _Pool:
    """Idle connections per origin, a global connection limit and a FIFO of waiters.

    A released connection is handed straight to the oldest waiter for its origin, so a request
    that waited is never overtaken by one that arrived later; a freed slot wakes the oldest
    waiter of any origin.
    """

    def __init__(self, max_connections: int, keepalive_expiry: float) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self.idle: dict[_Origin, list[_Connection]] = {}
        self.open = 0  # connections open or being opened, idle or busy
        self.waiters: collections.deque[tuple[_Origin, asyncio.Future[_Connection | None]]] = (
            collections.deque()
        )
        self.closing = False
        self.resent = 0
        self.dispatcher = _Dispatcher()
        self._timer: PreciseTimer | None = None

    def timer(self) -> PreciseTimer:
        """The precise timer of the running loop, made on first use."""
        if self._timer is None:
            self._timer = PreciseTimer(asyncio.get_running_loop())
        return self._timer

    def close_timer(self) -> None:
        if self._timer is not None:
            self._timer.close()
            self._timer = None

    def take_idle(self, origin: _Origin) -> _Connection | None:
        idle = self.idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed or not conn.reusable:
                continue
            if now - conn.idle_since > self.idle_limit(conn):
                conn.abort()  # connection_lost returns its slot
                continue
            return conn
        return None

    def idle_limit(self, conn: _Connection) -> float:
        """How long an idle connection may wait to be reused: our expiry, or less where the
        server announced a shorter idle timeout (retired a margin before it, so that the
        server's close and our next request cannot cross on the wire)."""
        if conn.idle_timeout is None:
            return self.keepalive_expiry
        return min(self.keepalive_expiry, max(0.0, conn.idle_timeout - _CLOSE_MARGIN_S))

    def evict_idle(self) -> bool:
        """Close one idle connection (of any origin) so that its slot can be reused."""
        for conns in self.idle.values():
            while conns:
                conn = conns.pop(0)
                if not conn.closed:
                    conn.abort()
                    return True
        return False

    def release(self, conn: _Connection) -> None:
        conn.exchange = None
        if conn.closed:
            return  # connection_lost has returned, or will return, the slot
        if not conn.reusable or self.closing:
            conn.abort()
            return
        for i, (origin, waiter) in enumerate(self.waiters):
            if origin == conn.origin and not waiter.done():
                del self.waiters[i]
                waiter.set_result(conn)
                return
        if any(not waiter.done() for _, waiter in self.waiters):
            conn.abort()  # another origin is waiting for a slot: free this one for it
            return
        conn.idle_since = time.monotonic()
        self.idle.setdefault(conn.origin, []).append(conn)

    def return_slot(self, conn: _Connection) -> None:
        """Give back the slot a connection held; idempotent, since both a failed connect and
        a later ``connection_lost`` may report the same connection."""
        if not conn.holds_slot:
            return
        conn.holds_slot = False
        idle = self.idle.get(conn.origin)
        if idle is not None and conn in idle:
            idle.remove(conn)
        self.open -= 1
        while self.waiters:
            _, waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # "a slot is free: open a connection"
                return


class LoadgenTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` for plain-http HTTP/1.1 streams; see the module doc.

    ``max_connections`` caps open connections across all origins, like ``httpx.Limits``;
    idle connections are closed after ``keepalive_expiry`` seconds.
    """

    def __init__(self, *, max_connections: int = 100, keepalive_expiry: float = 30.0) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
        self._pool = _Pool(max_connections, keepalive_expiry)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"LoadgenTransport speaks plain http only, not {url.scheme!r}"
            )
        timeouts = request.extensions.get("timeout", {})
        read_timeout = timeouts.get("read")
        body = await _request_body(request)
        head = _request_head(request, len(body))
        send_at = request.extensions.get(SEND_AT)
        origin = (url.host, url.port or 80)
        conn = await self._acquire(origin, timeouts)
        resent = False
        while True:
            reused = conn.served > 0
            try:
                exchange = conn.send(head + body, request.method == "HEAD", send_at)
                wait = read_timeout
                if wait is not None and send_at is not None:
                    wait += max(0, send_at - time.monotonic_ns()) / 1e9
                status, reason, headers = await _wait_head(exchange, wait)
                break
            except (httpx.RemoteProtocolError, httpx.ReadError):
                stale = reused and not conn.got_bytes and not resent
                conn.abort()
                self._pool.release(conn)
                if not stale:
                    raise
            except BaseException:
                conn.abort()
                self._pool.release(conn)
                raise
            # The server closed a kept-alive connection as the request went out (the race
            # RFC 9112 section 9.3.1 leaves to clients): nothing of it was answered, so it is
            # sent once more on a fresh connection, with its send stamp renewed: at once, or
            # at its instant when the close came while it was armed (never early).
            resent = True
            self._pool.resent += 1
            conn = await self._acquire(origin, timeouts, fresh=True)
        return httpx.Response(
            status,
            headers=headers,
            stream=_Body(self._pool, conn, exchange, read_timeout),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": reason,
                "loadgen.tap": exchange,
                "loadgen.resent": resent,
            },
        )

    @property
    def resent(self) -> int:
        """Requests sent again because a kept-alive connection was closed under them."""
        return self._pool.resent

    async def _acquire(
        self, origin: _Origin, timeouts: dict[str, float | None], *, fresh: bool = False
    ) -> _Connection:
        pool = self._pool
        if pool.closing:
            raise httpx.ConnectError("the transport is closed")
        loop = asyncio.get_running_loop()
        pool_timeout = timeouts.get("pool")
        deadline = None if pool_timeout is None else loop.time() + pool_timeout
        while True:
            conn = None if fresh else pool.take_idle(origin)
            if conn is not None:
                return conn
            if pool.open < pool.max_connections:
                return await self._connect(origin, timeouts.get("connect"))
            pool.evict_idle()  # its slot comes back through connection_lost, to a waiter
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            pool.waiters.append((origin, waiter))
            remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
            try:
                async with asyncio.timeout(remaining):
                    handed = await waiter
            except TimeoutError:
                raise httpx.PoolTimeout(f"no free connection within {pool_timeout:g} s") from None
            except BaseException:
                # Cancelled just as a connection or slot was handed over: pass it on.
                if waiter.done() and not waiter.cancelled():
                    got = waiter.result()
                    if got is not None:
                        pool.release(got)
                    elif pool.waiters:
                        _, nxt = pool.waiters.popleft()
                        if not nxt.done():
                            nxt.set_result(None)
                raise
            if handed is not None:
                return handed

    async def _connect(self, origin: _Origin, connect_timeout: float | None) -> _Connection:
        pool = self._pool
        pool.open += 1
        conn = _Connection(pool, origin)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                if _SO_TIMESTAMPNS is None:
                    await loop.create_connection(lambda: conn, origin[0], origin[1])
                else:
                    conn.sock = await _connect_stamped(loop, origin)
                    await loop.create_connection(lambda: conn, sock=conn.sock)
        except TimeoutError:
            pool.return_slot(conn)
            raise httpx.ConnectTimeout(f"connecting to {origin[0]}:{origin[1]} timed out") from None
        except OSError as exc:
            pool.return_slot(conn)
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            pool.return_slot(conn)
            conn.abort()
            raise
        return conn

    async def aclose(self) -> None:
        pool = self._pool
        pool.closing = True
        pool.close_timer()
        for conns in pool.idle.values():
            for conn in conns:
                conn.abort()
        pool.idle.clear()


async def _request_body(request: httpx.Request) -> bytes:
    try:
        return request.content
    except httpx.RequestNotRead:
        return await request.aread()


def _request_head(request: httpx.Request, length: int) -> bytes:
    """The request line and headers; the body is always sent with a Content-Length."""
    lines = [request.method.encode() + b" " + (request.url.raw_path or b"/") + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines.append(name + b": " + value)
    if length or request.method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: " + str(length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _wait_head(
    exchange: StreamTap, read_timeout: float | None
) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    try:
        async with asyncio.timeout(read_timeout):
            return await exchange._head
    except TimeoutError:
        raise httpx.ReadTimeout(f"no response within {read_timeout:g} s") from None


# -- kernel receive stamps ----------------------------------------------------------------------

_SO_TIMESTAMPNS: int | None = getattr(
    socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None
)
_TIMESPEC = struct.Struct("qq")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)
_SOL_SOCKET = socket.SOL_SOCKET
_unpack_timespec = _TIMESPEC.unpack_from
_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns


class _StampedSocket(socket.socket):
    """A client socket that keeps the kernel's receive time of the data it last returned.

    With ``SO_TIMESTAMPNS`` the kernel stamps each segment as it arrives; ``recvmsg_into``
    returns the stamp of the latest one read (TCP keeps the later stamp when it coalesces
    segments). Reads therefore carry the moment their bytes reached the host, whatever the
    event loop was busy with at the time: a busy client no longer adds its own lateness to
    TTFT and inter-token gaps. The stamp is on the realtime clock and is moved to the
    monotonic clock by the offset between the two, read together at each receive. asyncio's
    selector transport reads a buffered protocol's data with ``recv_into``, so that is the
    method replaced.
    """

    __slots__ = ("rx_ns",)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        # On the path of every read: no per-call lookups beyond what the stamp needs.
        if nbytes:
            buffer = memoryview(buffer)[:nbytes]
        received, ancdata, _, _ = self.recvmsg_into((buffer,), _ANC_SIZE, flags)
        if ancdata:
            level, kind, payload = ancdata[0]  # the one control message this socket asks for
            if kind == _SO_TIMESTAMPNS and level == _SOL_SOCKET:
                sec, nsec = _unpack_timespec(payload)
                # The clock offset at the midpoint of two monotonic reads around the realtime
                # one; read again if a preemption stretched that bracket (a busy machine).
                m1 = _monotonic_ns()
                real = _time_ns()
                m2 = _monotonic_ns()
                if m2 - m1 > 20_000:
                    m1 = _monotonic_ns()
                    real = _time_ns()
                    m2 = _monotonic_ns()
                self.rx_ns = sec * 1_000_000_000 + nsec + (m1 + m2) // 2 - real
                return received
        self.rx_ns = 0  # not stamped (timestamping switching on): never an earlier read's
        return received


async def _connect_stamped(loop: asyncio.AbstractEventLoop, origin: _Origin) -> _StampedSocket:
    """Resolve and connect like ``create_connection`` does, on a stamping socket."""
    assert _SO_TIMESTAMPNS is not None
    infos = await loop.getaddrinfo(origin[0], origin[1], type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = _StampedSocket(family, kind, proto)
        sock.rx_ns = 0
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error or OSError(f"cannot resolve {origin[0]}")
