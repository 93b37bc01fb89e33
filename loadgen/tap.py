"""One exchange's response as the transport hands it on: its body pieces with their receive
stamps, and the instant its request was sent.

A :class:`StreamTap` is what ``LoadgenTransport`` puts in a response's
``extensions["loadgen.tap"]``: the client reads a body through :meth:`StreamTap.consume`, one
callback per piece, instead of httpx's async iterator, and times the network rather than its
own event loop's backlog. The connection that parses the bytes (``loadgen.connections``)
queues pieces on the tap; a :class:`Dispatcher` delivers them once per event-loop pass, so
every ready socket is read and stamped before any body is parsed.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import httpx

DRAIN_S = 1.0
"""How long the rest of a body is awaited, and discarded, after the consumer has stopped, so a
finished connection can be reused."""


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

    def __init__(self, dispatcher: Dispatcher) -> None:
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
                    loop.call_later(DRAIN_S, self._watchdog, DRAIN_S)
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


class Dispatcher:
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
