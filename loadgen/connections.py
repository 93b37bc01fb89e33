"""HTTP/1.1 connections for the lean transport: one keep-alive connection's response framing,
and the pool that hands connections out.

A :class:`Connection` is an ``asyncio.BufferedProtocol`` that decodes the response framing
(content-length, chunked, or read-to-close) inside ``buffer_updated``, so one socket read
becomes one body piece queued on the exchange's :class:`~loadgen.tap.StreamTap`, stamped with
the kernel's receive time where there is one (``loadgen.kernel_stamps``), with no intermediate
byte copies or parser objects. It honours the server's ``Keep-Alive: timeout, max`` (RFC 9112
appendix C.2.2) and is never reused in an unknown state.

The :class:`Pool` is a list of idle connections per origin plus a FIFO of waiters: O(1) per
request, with a global connection limit; ``loadgen.transport`` opens connections into it and
turns what happens on them into httpx's responses and exceptions.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import cast

import httpx

from loadgen.clock import PreciseTimer
from loadgen.kernel_stamps import StampedSocket
from loadgen.tap import Dispatcher, StreamTap

MAX_HEAD = 64 * 1024
"""Refuse response heads (and trailer lines) larger than this: a server streaming garbage must
not eat memory."""

Origin = tuple[str, int]
CLOSE_MARGIN_S = 1.0
"""An idle connection is retired this long before the idle timeout its server announced."""


# Body framing states.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _TO_CLOSE, _IDLE = range(8)


_READ_SIZE = 64 * 1024


class Connection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection carrying at most one exchange at a time.

    A buffered protocol, because asyncio's plain ``Protocol`` reads each time into a fresh
    256 KiB bytes object: above glibc's mmap threshold, so every read of a 300-byte event
    cost an mmap/munmap pair, the largest single client cost per streamed token.
    """

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.sock: StampedSocket | None = None
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
        # Stamped just before the write, which asyncio makes at once when its buffer is empty:
        # the instant the request reached the kernel. Not after it: the socket call lets go of
        # the GIL, and on a busy host another thread of the gate (the telemetry sampler) can
        # keep it for tens of milliseconds, in which a fast engine answers; a stamp taken
        # then made TTFTs below zero (seen with real vLLM on two busy cores).
        exchange.sent_ns = exchange._last_rx_ns = time.monotonic_ns()
        self.transport.write(data)

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
                    if end - pos > MAX_HEAD:
                        raise httpx.RemoteProtocolError("response head too large")
                    break
                state = self._head(buf[pos:stop])
                pos = stop + skip
            elif state == _TRAILER:
                stop = buf.find(b"\n", pos)
                if stop < 0:
                    if end - pos > MAX_HEAD:
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


class Pool:
    """Idle connections per origin, a global connection limit and a FIFO of waiters.

    A released connection is handed straight to the oldest waiter for its origin, so a request
    that waited is never overtaken by one that arrived later; a freed slot wakes the oldest
    waiter of any origin.
    """

    def __init__(self, max_connections: int, keepalive_expiry: float) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self.idle: dict[Origin, list[Connection]] = {}
        self.open = 0  # connections open or being opened, idle or busy
        self.waiters: collections.deque[tuple[Origin, asyncio.Future[Connection | None]]] = (
            collections.deque()
        )
        self.closing = False
        self.resent = 0
        self.dispatcher = Dispatcher()
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

    def take_idle(self, origin: Origin) -> Connection | None:
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

    def idle_limit(self, conn: Connection) -> float:
        """How long an idle connection may wait to be reused: our expiry, or less where the
        server announced a shorter idle timeout (retired a margin before it, so that the
        server's close and our next request cannot cross on the wire)."""
        if conn.idle_timeout is None:
            return self.keepalive_expiry
        return min(self.keepalive_expiry, max(0.0, conn.idle_timeout - CLOSE_MARGIN_S))

    def evict_idle(self) -> bool:
        """Close one idle connection (of any origin) so that its slot can be reused."""
        for conns in self.idle.values():
            while conns:
                conn = conns.pop(0)
                if not conn.closed:
                    conn.abort()
                    return True
        return False

    def release(self, conn: Connection) -> None:
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

    def return_slot(self, conn: Connection) -> None:
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
