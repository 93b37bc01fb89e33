"""Pooled connections as servers manage them: ``Keep-Alive: timeout, max`` honoured, and a
request whose reused connection the server closed before answering is sent once more.

The servers here are real asyncio TCP servers speaking HTTP/1.1 by hand, with the habits of
real ones: cpp-httplib (llama.cpp's server) announces ``Keep-Alive: timeout=5, max=100`` on
every response (``../shared/captures/llamacpp-health.http``) and closes after that many
requests; uvicorn (vLLM's server) closes idle connections after ``timeout_keep_alive`` (5 s)
and announces nothing (uvicorn/protocols/http/h11_impl.py, ``timeout_keep_alive_handler``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from loadgen.client import RequestSpec, Target, make_client, send_request
from loadgen.records import RequestRecord
from loadgen.transport import LoadgenTransport

BODY = b'{"ok":true}'


@asynccontextmanager
async def server(
    *, max_requests: int | None, idle_s: float | None, announce: bool
) -> AsyncIterator[tuple[int, list[int]]]:
    """Serve until the block ends; yields the port and a per-connection request count list.
    After the last request a connection allows, the next one that arrives on it is closed
    without a response (the race a silent close leaves), as is an idle one."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = len(served)
        served.append(0)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), idle_s)
                except (TimeoutError, asyncio.IncompleteReadError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if max_requests is not None and served[n] >= max_requests:
                    return  # the request arrived on a connection we meant to close
                served[n] += 1
                hdrs = [
                    b"HTTP/1.1 200 OK",
                    b"Content-Type: application/json",
                    b"Content-Length: %d" % len(BODY),
                ]
                if announce:
                    hdrs.append(
                        b"Keep-Alive: timeout=%d, max=%d" % (int(idle_s or 5), max_requests or 100)
                    )
                writer.write(b"\r\n".join(hdrs) + b"\r\n\r\n" + BODY)
                await writer.drain()
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield port, served
    finally:
        srv.close()
        await srv.wait_closed()


async def _run(port: int, n: int, gap_s: float) -> tuple[int, int]:
    transport = LoadgenTransport(max_connections=1, keepalive_expiry=30.0)
    ok = 0
    async with httpx.AsyncClient(transport=transport, base_url=f"http://127.0.0.1:{port}") as c:
        for _ in range(n):
            r = await c.post("/v1/completions", content=b"{}")
            ok += r.status_code == 200 and r.content == BODY
            await asyncio.sleep(gap_s)
    return ok, transport.resent


def _through_one_slot(
    n: int, gap_s: float, **srv: float | bool | None
) -> tuple[int, int, list[int]]:
    """``n`` requests ``gap_s`` apart through one pooled connection slot: how many came back
    whole, how many were resent, and how many each server connection answered."""

    async def go() -> tuple[int, int, list[int]]:
        async with server(**srv) as (port, served):  # type: ignore[arg-type]
            ok, resent = await _run(port, n, gap_s)
            return ok, resent, served

    return asyncio.run(go())


def test_announced_max_retires_the_connection_before_the_server_drops_it() -> None:
    ok, resent, served = _through_one_slot(10, 0.0, max_requests=3, idle_s=5, announce=True)
    assert ok == 10 and resent == 0  # never sent the 4th request to a closing server
    assert served == [3, 3, 3, 1]


def test_announced_idle_timeout_retires_idle_connections() -> None:
    # 1.5 s apart: longer than the 1 s timeout announced (idle_s 1.2 is announced as 1)
    ok, resent, served = _through_one_slot(3, 1.5, max_requests=None, idle_s=1.2, announce=True)
    assert ok == 3 and resent == 0
    assert served == [1, 1, 1]


def test_unannounced_close_is_resent_once_on_a_fresh_connection() -> None:
    ok, resent, served = _through_one_slot(6, 0.0, max_requests=2, idle_s=30, announce=False)
    assert ok == 6  # no error reaches the caller: it was the client's race
    assert resent == 2  # the 3rd and 5th went out on connections closed under them
    assert sum(served) == 6


def test_unannounced_idle_close_is_seen_and_the_connection_not_reused() -> None:
    """uvicorn's habit: a silent close of an idle connection. The pool sees the FIN and
    opens a fresh connection; nothing is lost and nothing needs sending twice."""
    ok, resent, served = _through_one_slot(3, 0.6, max_requests=None, idle_s=0.3, announce=False)
    assert ok == 3 and resent == 0
    assert served == [1, 1, 1]


def test_a_fresh_connection_that_dies_is_an_error_not_resent() -> None:
    async def go() -> None:
        async with server(max_requests=0, idle_s=5, announce=False) as (
            port,
            _,
        ):
            transport = LoadgenTransport(max_connections=1)
            async with httpx.AsyncClient(
                transport=transport, base_url=f"http://127.0.0.1:{port}"
            ) as c:
                with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                    await c.post("/", content=b"{}")
            assert transport.resent == 0

    asyncio.run(go())


@pytest.mark.parametrize(
    ("header", "timeout", "max_requests"),
    [
        (b"timeout=5, max=100", 5, 100),
        (b"Timeout = 2 ,MAX=3", 2, 3),
        (b"max=inf, timeout=nan", None, None),  # a hostile engine's values bound nothing
        (b"timeout=-1, max=99999999999999999999", None, None),
        (b"timeout, max=, =7", None, None),
    ],
)
def test_keep_alive_header_is_read_or_ignored(
    header: bytes, timeout: int | None, max_requests: int | None
) -> None:
    from loadgen.connections import Connection, Pool

    conn = Connection(Pool(1, 30.0), ("127.0.0.1", 1))
    conn._keep_alive(header)
    assert conn.idle_timeout == timeout and conn.max_requests == max_requests


STREAM = (
    b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n'
    b"data: [DONE]\n\n"
)


def test_a_resent_request_is_timed_from_its_resend() -> None:
    """The server answers the first request of each connection and closes it LATE_S after the
    second arrives, unanswered. The record of that second request says it was resent, and
    its send stamp is the resend's: TTFT does not include the LATE_S its first try waited,
    which shows as dispatch delay instead."""
    late_s = 0.3
    closed_at: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for n in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                if n == 1:
                    await asyncio.sleep(late_s)
                    closed_at.append(time.monotonic_ns())
                    return
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(STREAM), STREAM)
                )
                await writer.drain()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    async def go() -> list[RequestRecord]:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        target = Target("t", f"http://127.0.0.1:{port}")
        records = []
        try:
            async with make_client(target, 1) as client:
                for i in range(2):
                    req = RequestSpec(request_id=i, prompt="x", max_tokens=2)
                    at = time.monotonic_ns() + 20_000_000
                    records.append(await send_request(client, target, req, at, armed=True))
        finally:
            srv.close()
            await srv.wait_closed()
        return records

    first, second = asyncio.run(go())
    assert first.ok and not first.resent
    assert second.ok and second.resent, second.error_message
    assert second.text == "ab"
    (closed,) = closed_at
    assert second.sent_ns > closed  # stamped when it went out again, not on its first try
    assert second.dispatch_delay_ns >= late_s * 1e9
    assert second.ttft_ns is not None and second.ttft_ns < late_s * 1e9


def test_a_request_armed_on_a_connection_closed_under_it_still_leaves_on_time() -> None:
    """The server answers one request per connection and closes it 30 ms later, silently; the
    next request was armed on that connection 300 ms ahead of its instant. It goes out again
    on a fresh connection, at its instant, not early."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(STREAM), STREAM)
            )
            await writer.drain()
            await asyncio.sleep(0.03)
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    async def go() -> tuple[RequestRecord, RequestRecord, int]:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        target = Target("t", f"http://127.0.0.1:{port}")
        try:
            async with make_client(target, 1) as client:
                req = RequestSpec(request_id=0, prompt="x", max_tokens=2)
                first = await send_request(client, target, req, time.monotonic_ns(), armed=True)
                at = time.monotonic_ns() + 300_000_000
                req = RequestSpec(request_id=1, prompt="x", max_tokens=2)
                second = await send_request(client, target, req, at, armed=True)
        finally:
            srv.close()
            await srv.wait_closed()
        return first, second, at

    first, second, at = asyncio.run(go())
    assert first.ok and not first.resent
    assert second.ok and second.resent, second.error_message
    assert second.sent_ns >= at  # at its instant, not when the close was seen
