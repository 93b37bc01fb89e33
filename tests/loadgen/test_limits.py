"""Everything an engine sends is bounded: hostile servers on loopback, byte for byte.

Each server here is a real socket speaking just enough HTTP/1.1; its answer is written by the
test, so an SSE line without end, an endless error body or a trickle is exactly what the
client sees from a broken or hostile engine. What is asserted is what the code guarantees (the
kind and message of the failure, the connection closed rather than reused, what was read),
never how long it took.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from loadgen.client import (
    MAX_BODY_BYTES,
    MAX_ERROR_BODY_BYTES,
    RequestSpec,
    Target,
    excerpt,
    make_client,
    send_request,
)
from loadgen.records import RequestRecord
from loadgen.sse import MAX_SSE_EVENT_BYTES, MAX_SSE_LINE_BYTES, SSELimitError, SSEParser
from loadgen.suite import Correctness, Probe, run_correctness, run_probes

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[bool]]
"""Writes the answer to one request; True when it is complete and the connection may carry
another request, False to hold the connection open until the client closes it."""

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
EVENT = b'data: {"choices":[{"index":0,"text":" w"}]}\n\n'


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class Hostile:
    """A loopback server that answers each request with ``answer``; it counts connections and
    the answers it wrote completely."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.completed = 0
        self.paths: list[str] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def __aenter__(self) -> Hostile:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break  # the client closed between requests
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.paths.append(path)
                if not await self.answer(reader, writer, path):
                    while await reader.read(1 << 16):
                        pass  # hold the connection until the client gives up on it
                    break
                self.completed += 1
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            self._tasks.discard(task)
            writer.transport.abort()


async def normal_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: str) -> bool:
    writer.write(STREAM_HEAD + chunk(EVENT) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


def then(first: Answer, rest: Answer) -> Answer:
    """``first`` for the first request, ``rest`` for every later one."""
    calls = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, p: str) -> bool:
        nonlocal calls
        calls += 1
        return await (first if calls == 1 else rest)(reader, writer, p)

    return answer


def stream_then_hang(body: bytes) -> Answer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: str) -> bool:
        writer.write(STREAM_HEAD + chunk(body))
        await writer.drain()
        return False

    return answer


async def two_requests(url: str, *, lean: bool = True, **target: Any) -> list[RequestRecord]:
    """Two requests one after the other on one client (so a reusable connection is reused)."""
    t = Target("t", url, **{"timeout_s": 5.0, **target})
    async with make_client(t, 1, lean=lean) as client:
        return [
            await send_request(client, t, RequestSpec(i, "hi", 4), time.monotonic_ns())
            for i in range(2)
        ]


def assert_normal(record: RequestRecord) -> None:
    assert record.error_kind is None, record.error_message
    assert record.text == " w"


# -- SSE: a line, an event ------------------------------------------------------------------


@pytest.mark.parametrize("lean", [True, False])
def test_an_sse_line_without_end_fails_at_the_cap_and_the_connection_is_closed(
    lean: bool,
) -> None:
    """The line is over the cap and then the server holds on: without the cap the client
    would buffer it and wait; with it the request fails naming the cap, the client closes
    that connection and the next request opens a new one."""
    line = b"data: " + b"x" * (MAX_SSE_LINE_BYTES + 1)

    async def main() -> tuple[list[RequestRecord], Hostile]:
        async with Hostile(then(stream_then_hang(line), normal_stream)) as server:
            return await two_requests(server.url, lean=lean), server

    (first, second), server = asyncio.run(main())
    assert first.status == 200
    assert first.error_kind == "protocol_error", first.error_message
    assert first.error_message is not None
    assert "MAX_SSE_LINE_BYTES" in first.error_message
    assert str(MAX_SSE_LINE_BYTES) in first.error_message
    assert_normal(second)
    assert server.connections == 2  # the first connection was not reused


def test_an_sse_event_without_end_fails_at_the_cap() -> None:
    lines = b"data: x\n" * (MAX_SSE_EVENT_BYTES // 8 + 1_000)  # never the blank line

    async def main() -> tuple[list[RequestRecord], Hostile]:
        async with Hostile(then(stream_then_hang(lines), normal_stream)) as server:
            return await two_requests(server.url), server

    (first, second), server = asyncio.run(main())
    assert first.error_kind == "protocol_error", first.error_message
    assert first.error_message is not None
    assert "MAX_SSE_EVENT_BYTES" in first.error_message
    assert_normal(second)
    assert server.connections == 2


def feed_all(parser: SSEParser, pieces: list[bytes]) -> None:
    for piece in pieces:
        parser.feed(piece)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_the_parser_refuses_a_line_or_an_event_past_its_cap(eol: bytes) -> None:
    pieces = [b"x" * 4096] * (MAX_SSE_LINE_BYTES // 4096 + 1)
    with pytest.raises(SSELimitError, match="MAX_SSE_LINE_BYTES"):
        feed_all(SSEParser(), [b"data: ", *pieces])

    line = b"data: " + b"x" * (4096 - 6 - len(eol)) + eol  # 4096 bytes
    with pytest.raises(SSELimitError, match="MAX_SSE_EVENT_BYTES"):
        feed_all(SSEParser(), [line] * (MAX_SSE_EVENT_BYTES // 4096 + 2))


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_lines_and_events_under_the_caps_still_parse_in_any_pieces(eol: bytes) -> None:
    big = b"y" * (MAX_SSE_LINE_BYTES - 100)
    # A long line, then an event of many lines whose sum stays under the event cap.
    many = [b"z" * 1000] * (MAX_SSE_EVENT_BYTES // 1010 - 10)
    raw = b"data: " + big + eol + eol + b"".join(b"data:" + m + eol for m in many) + eol
    parser = SSEParser()
    events = []
    for i in range(0, len(raw), 777):
        events.extend(parser.feed(raw[i : i + 777]))
    events.extend(parser.close())
    assert [len(e.data) for e in events] == [len(big), len(many) * 1001 - 1]


class CountingBuffer(bytearray):
    """A bytearray that counts the bytes its searches look at."""

    looked_at = 0

    def rfind(self, sub: Any, start: Any = None, end: Any = None) -> int:
        CountingBuffer.looked_at += len(self) - (start or 0)
        return super().rfind(sub, *(a for a in (start, end) if a is not None))

    def find(self, sub: Any, start: Any = None, end: Any = None) -> int:
        CountingBuffer.looked_at += len(self) - (start or 0)
        return super().find(sub, *(a for a in (start, end) if a is not None))

    def __contains__(self, item: Any) -> bool:
        CountingBuffer.looked_at += len(self)
        return super().__contains__(item)


def test_a_line_sent_in_small_pieces_is_scanned_once() -> None:
    """Linear, not quadratic: a line that arrives 8 bytes at a time is not searched again
    from its start on every read. (The parser's buffer is swapped for one that counts what
    its searches look at: no timing involved.)"""
    parser = SSEParser()
    parser._buf = CountingBuffer()
    CountingBuffer.looked_at = 0
    fed = 0
    for piece in [b"data: ", *[b"abcdefgh"] * 100_000, b"\n\n"]:
        events = parser.feed(piece)
        fed += len(piece)
    assert len(events) == 1 and len(events[0].data) == 800_000
    assert CountingBuffer.looked_at <= 2 * fed


# -- error bodies, the deadline, the trailer --------------------------------------------------


def test_an_endless_error_body_is_read_up_to_its_cap_and_quoted_as_an_excerpt() -> None:
    body = b"\x1b[31m" + b"A" * (16 << 20)  # then the server holds on

    async def error(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: str) -> bool:
        writer.write(
            b"HTTP/1.1 500 Oops\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n"
            b"\r\n" + chunk(body)
        )
        await writer.drain()
        return False

    async def main() -> tuple[list[RequestRecord], Hostile]:
        async with Hostile(then(error, normal_stream)) as server:
            return await two_requests(server.url, timeout_s=3.0), server

    (first, second), server = asyncio.run(main())
    assert first.status == 500 and first.error_kind == "http_5xx"
    message = first.error_message
    assert message is not None
    assert f"MAX_ERROR_BODY_BYTES ({MAX_ERROR_BODY_BYTES} bytes)" in message
    assert message.startswith("HTTP 500: \\x1b[31mAAAA")
    assert message.isprintable() and len(message) < 400
    assert_normal(second)
    assert server.connections == 2


def test_an_error_message_is_escaped_and_a_read_error_body_keeps_the_connection() -> None:
    payload = json.dumps({"error": {"message": "\x1b[2Jboom\nFAKE LOG LINE " + "b" * 1000}})

    async def error(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: str) -> bool:
        body = payload.encode()
        writer.write(
            b"HTTP/1.1 503 Busy\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        return True

    async def main() -> tuple[list[RequestRecord], Hostile]:
        async with Hostile(then(error, normal_stream)) as server:
            return await two_requests(server.url), server

    (first, second), server = asyncio.run(main())
    assert first.error_kind == "http_5xx"
    assert first.error_message is not None
    assert first.error_message.startswith("HTTP 503: \\x1b[2Jboom\\nFAKE LOG LINE bbb")
    assert first.error_message.isprintable() and first.error_message.endswith("…")
    assert_normal(second)
    assert server.connections == 1  # a body read whole within its cap: the connection is reused


def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: str) -> Awaitable[bool]:
    """A keep-alive comment every 0.05 s, forever: never a stall, never an end."""

    async def go() -> bool:
        writer.write(STREAM_HEAD)
        while True:
            writer.write(chunk(b":\n"))
            await writer.drain()
            await asyncio.sleep(0.05)

    return go()


@pytest.mark.parametrize("lean", [True, False])
def test_a_trickling_engine_is_cut_at_the_deadline(lean: bool) -> None:
    async def main() -> tuple[list[RequestRecord], Hostile]:
        async with Hostile(then(trickle, normal_stream)) as server:
            return await two_requests(server.url, lean=lean, timeout_s=2.0, deadline_s=0.5), server

    (first, second), server = asyncio.run(main())
    assert first.status == 200
    assert first.error_kind == "timeout", first.error_message
    assert first.error_message is not None and "deadline_s of 0.5 s" in first.error_message
    assert_normal(second)
    assert server.connections == 2


def test_the_deadline_counts_from_the_send_of_an_armed_request() -> None:
    """Armed 1.5 s ahead with a deadline of 1 s: the request is still in time."""

    async def main() -> RequestRecord:
        async with Hostile(normal_stream) as server:
            t = Target("t", server.url, deadline_s=1.0)
            async with make_client(t, 1) as client:
                at = time.monotonic_ns() + 1_500_000_000
                return await send_request(client, t, RequestSpec(0, "hi", 4), at, armed=True)

    assert_normal(asyncio.run(main()))


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_the_deadline_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        Target("t", "http://127.0.0.1:1", deadline_s=bad)
    assert Target("t", "http://127.0.0.1:1").deadline_s == 600.0


def test_a_trailer_line_without_end_fails_the_request() -> None:
    """After the last chunk the transport reads the trailer; a line there without end used
    to be buffered for as long as the server kept sending."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: str) -> bool:
        writer.write(STREAM_HEAD + chunk(EVENT) + b"0\r\n" + b"X" * (256 << 10))
        await writer.drain()
        return False

    async def main() -> tuple[list[RequestRecord], Hostile]:
        async with Hostile(then(answer, normal_stream)) as server:
            return await two_requests(server.url, timeout_s=3.0), server

    (first, second), server = asyncio.run(main())
    assert first.error_kind == "truncated", first.error_message
    assert first.error_message is not None and "trailer line too long" in first.error_message
    assert_normal(second)
    assert server.connections == 2


def test_excerpt_escapes_and_cuts() -> None:
    assert excerpt("plain ünïcode ✓") == "plain ünïcode ✓"
    assert excerpt("a\nb\x1b[31mc\u202ed\\") == "a\\nb\\x1b[31mc\\u202ed\\\\"
    cut = excerpt("\x00" * 500)
    assert len(cut) <= 200 and cut.endswith("…") and cut.isprintable()
    assert len(excerpt("x" * 10_000)) == 200


# -- the probes and greedy checks of the suite ------------------------------------------------


def huge_json(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: str
) -> Awaitable[bool]:
    """A 200 JSON answer far over MAX_BODY_BYTES (by its Content-Length, and in fact)."""

    async def go() -> bool:
        size = 8 * MAX_BODY_BYTES
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {size}\r\n\r\n".encode()
        )
        block = b" " * (1 << 20)
        for _ in range(size // len(block) - 1):
            writer.write(block)
            await writer.drain()  # blocks for good once the client stops reading
        writer.write(block)  # the last, queued: "completed" counts before the client has it
        return True

    return go()


def test_a_probe_body_over_the_cap_is_a_failed_probe_and_not_read_whole() -> None:
    async def main() -> tuple[list[Any], Hostile]:
        async with Hostile(huge_json) as server:
            probes = [Probe("completions", "completions", {"max_tokens": 8})]
            return await run_probes(Target("t", server.url), probes), server

    (result,), server = asyncio.run(main())
    assert result.status == 200 and not result.ok
    assert f"MAX_BODY_BYTES ({MAX_BODY_BYTES} bytes)" in " ".join(result.problems)
    assert server.completed == 0  # the client closed before the server could write it all


def test_a_greedy_check_over_the_cap_is_an_error_naming_it() -> None:
    async def main() -> tuple[list[Any], Hostile]:
        async with Hostile(huge_json) as server:
            results = await run_correctness(
                Target("t", server.url), scenario=Correctness(probes_count=1, envelope_load=0)
            )
            return results, server

    (result,), server = asyncio.run(main())
    assert result.status == 200
    # The cap follows from the request (1 MiB of slack + its tokens' top-k and prompt ids), far
    # below MAX_BODY_BYTES: an endless answer costs the gate about what a streamed line does.
    found = re.search(r"body over its cap \((\d+) bytes\)", result.error or "")
    assert found is not None, result.error
    assert 1 << 20 < int(found.group(1)) < MAX_BODY_BYTES // 4
    assert server.completed == 0


def test_a_probe_that_trickles_ends_at_the_deadline() -> None:
    async def main() -> list[Any]:
        async with Hostile(trickle) as server:
            probes = [Probe("stream", "completions", {"max_tokens": 8}, stream=True)]
            return await run_probes(Target("t", server.url, deadline_s=0.5), probes)

    (result,) = asyncio.run(main())
    assert result.status is None and not result.ok
    assert any("deadline_s of 0.5 s" in p for p in result.problems), result.problems


def test_a_model_list_over_its_cap_is_not_read_for_the_context_length() -> None:
    """A list padded past MAX_MODELS_BODY_BYTES: the long-prompt probes are left out, as for
    an engine that does not report its context length; a normal list still sizes them."""

    def models(pad: int) -> Answer:
        async def answer(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
        ) -> bool:
            if path.endswith("/models"):
                card = {"id": "demo-model", "max_model_len": 64, "pad": "p" * pad}
                body = json.dumps({"object": "list", "data": [card]}).encode()
            else:
                body = b'{"error": {"message": "no"}}'
            writer.write(
                b"HTTP/1.1 400 No\r\ncontent-type: application/json\r\n"
                if not path.endswith("/models")
                else b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            )
            writer.write(f"content-length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            return True

        return answer

    async def main(pad: int) -> set[str]:
        async with Hostile(models(pad)) as server:
            return {p.name for p in await run_probes(Target("t", server.url))}

    assert "long_prompt" in asyncio.run(main(100))
    assert "long_prompt" not in asyncio.run(main(100 << 10))
