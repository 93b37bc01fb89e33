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

Where the parts live: this module is httpx's side (the transport, acquiring a connection,
resending on a stale one, the response body); ``loadgen.connections`` the wire (framing on one
connection, the pool); ``loadgen.tap`` what a response hands on (:class:`StreamTap`);
``loadgen.kernel_stamps`` the kernel's receive stamps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx

from loadgen.connections import Connection, Origin, Pool
from loadgen.kernel_stamps import SO_TIMESTAMPNS, connect_stamped
from loadgen.tap import StreamTap

SEND_AT = "loadgen.send_at_ns"
"""Request extension: the ``time.monotonic_ns()`` instant the request's bytes should leave.

The request is built, a connection taken (or opened) and the bytes queued now; only the socket
write waits, on a precise timer (:mod:`loadgen.clock`). A request whose instant has passed goes
at once. ``sent_ns`` is still the instant of the write."""


class _Body(httpx.AsyncByteStream):
    """The response body: yields pieces as the protocol queues them, each with its stamp."""

    def __init__(
        self, pool: Pool, conn: Connection, exchange: StreamTap, read_timeout: float | None
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


class LoadgenTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` for plain-http HTTP/1.1 streams; see the module doc.

    ``max_connections`` caps open connections across all origins, like ``httpx.Limits``;
    idle connections are closed after ``keepalive_expiry`` seconds.
    """

    def __init__(self, *, max_connections: int = 100, keepalive_expiry: float = 30.0) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
        self._pool = Pool(max_connections, keepalive_expiry)

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
        self, origin: Origin, timeouts: dict[str, float | None], *, fresh: bool = False
    ) -> Connection:
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
            waiter: asyncio.Future[Connection | None] = loop.create_future()
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

    async def _connect(self, origin: Origin, connect_timeout: float | None) -> Connection:
        pool = self._pool
        pool.open += 1
        conn = Connection(pool, origin)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                if SO_TIMESTAMPNS is None:
                    await loop.create_connection(lambda: conn, origin[0], origin[1])
                else:
                    conn.sock = await connect_stamped(loop, *origin)
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
