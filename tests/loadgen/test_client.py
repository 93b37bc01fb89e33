"""``send_request`` against a real socket, one test per stream variation."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadgen import RequestRecord, RequestSpec, Target, make_client, request_body, send_request

# serial: an armed request is checked to leave at its instant.
pytestmark = pytest.mark.serial

PROMPT = "one two three four"
MS = 1_000_000


def fetch(
    server_cls: Callable[[], Any],
    scenario: str = "basic",
    *,
    api: str = "completions",
    max_tokens: int = 5,
    timeout_s: float = 5.0,
    **extra: Any,
) -> tuple[RequestRecord, Any]:
    """Run one request against a fresh server; returns the record and the server."""

    async def main() -> tuple[RequestRecord, Any]:
        async with server_cls() as server:
            target = Target("t", server.url, api=api, timeout_s=timeout_s)  # type: ignore[arg-type]
            spec = RequestSpec(7, PROMPT, max_tokens, {"x_scenario": scenario, **extra})
            async with make_client(target, 2) as client:
                record = await send_request(client, target, spec, time.monotonic_ns())
            return record, server

    return asyncio.run(main())


def assert_ok(record: RequestRecord, tokens: int = 5) -> None:
    assert record.error_kind is None, record.error_message
    assert record.status == 200
    assert record.output_tokens == tokens
    assert record.text == "".join(f" w{i}" for i in range(tokens))
    assert record.first_token_ns is not None
    assert record.end_ns is not None
    assert record.sent_ns <= record.first_token_ns <= record.end_ns
    assert record.chunk_ns == sorted(record.chunk_ns)
    assert record.finish_reason == "length"


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_basic_stream_records_everything(stream_server: Any, api: str) -> None:
    record, server = fetch(stream_server, api=api, return_token_ids=True, logprobs=1)
    assert_ok(record)
    assert record.request_id == 7
    assert record.target == "t"
    assert record.prompt_tokens == 4
    assert record.chunk_tokens == [1] * 5
    assert record.token_ids == [100, 101, 102, 103, 104]
    assert record.logprobs == pytest.approx([-0.5, -0.51, -0.52, -0.53, -0.54])
    (received,) = server.received
    assert received.path == ("/v1/completions" if api == "completions" else "/v1/chat/completions")
    assert received.body["stream"] is True
    assert received.body["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


def test_request_body_merges_extra_but_always_streams() -> None:
    target = Target("t", "http://h:1", api="chat", model="m")
    spec = RequestSpec(0, "hi", 3, {"ignore_eos": True, "temperature": 0.0, "stream": False})
    body = request_body(target, spec)
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["model"] == "m"
    assert body["max_tokens"] == 3
    assert body["ignore_eos"] is True
    assert body["temperature"] == 0.0
    assert body["stream"] is True
    assert "prompt" not in body


def test_base_url_with_or_without_v1() -> None:
    assert Target("a", "http://h:1").url == "http://h:1/v1/completions"
    assert Target("a", "http://h:1/v1/", api="chat").url == "http://h:1/v1/chat/completions"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"name": "", "base_url": "http://h"}, "name"),
        ({"name": "a", "base_url": "h:1"}, "base_url"),
        ({"name": "a", "base_url": "http://h", "api": "embeddings"}, "api"),
        ({"name": "a", "base_url": "http://h", "timeout_s": 0}, "timeout_s"),
    ],
)
def test_target_validation_names_the_field(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Target(**kwargs)


def test_make_client_pool_is_explicit() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        make_client(Target("a", "http://h"), 0)


def test_comments_are_ignored(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "comments")
    assert_ok(record)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_crlf_framing(stream_server: Any, api: str) -> None:
    record, _ = fetch(stream_server, "crlf", api=api)
    assert_ok(record)


def test_events_split_across_reads(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "split", x_token_delay_s=0.002)
    assert_ok(record)
    # An event counts when its last piece arrives: the first token needs three writes.
    assert record.ttft_ns is not None
    assert record.ttft_ns >= 4 * MS


def test_multi_line_data_fields(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "multiline_data")
    assert_ok(record)


def test_multi_token_events_counted_from_usage_deltas(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "multi_token", x_token_delay_s=0.01)
    assert_ok(record)
    assert record.chunk_tokens == [3, 2]
    gaps = record.itl_gaps_ns()
    assert len(gaps) == 2  # the second event's two tokens; the first event's extras count nothing
    assert gaps[0] == gaps[1] == (record.chunk_ns[1] - record.chunk_ns[0]) / 2


def test_multi_token_events_counted_from_token_ids(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "multi_token_ids")
    assert_ok(record)
    assert record.chunk_tokens == [3, 2]
    assert record.prompt_tokens is None


def test_multi_token_events_without_any_count_fall_back_to_one_per_event(
    stream_server: Any,
) -> None:
    """The documented limitation: nothing in the stream says how many tokens an event holds."""
    record, _ = fetch(stream_server, "multi_token_bare")
    assert record.error_kind is None
    assert record.chunk_tokens == [1, 1]
    assert record.output_tokens == 2
    assert record.text == " w0 w1 w2 w3 w4"


def test_no_usage_counts_one_token_per_content_event(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "no_usage")
    assert_ok(record)
    assert record.prompt_tokens is None


def test_usage_only_final_chunk_gives_token_counts(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "final_usage_only")
    assert_ok(record)
    assert record.prompt_tokens == 4


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_empty_chunks_are_not_tokens(stream_server: Any, api: str) -> None:
    record, _ = fetch(stream_server, "empty_chunks", api=api)
    assert_ok(record)
    assert len(record.chunk_ns) == 5


def test_role_only_first_chat_chunk_is_not_the_first_token(stream_server: Any) -> None:
    record, _ = fetch(stream_server, api="chat", x_token_delay_s=0.03, logprobs=True)
    assert_ok(record)
    # The role chunk goes out immediately; the first content token 30 ms later.
    assert record.ttft_ns is not None
    assert record.ttft_ns >= 30 * MS
    assert record.chunk_tokens == [1] * 5
    assert record.logprobs is not None
    assert len(record.logprobs) == 5


def test_role_only_chunk_without_usage_is_not_a_token(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "no_usage", api="chat", x_token_delay_s=0.03)
    assert_ok(record)
    assert record.ttft_ns is not None
    assert record.ttft_ns >= 30 * MS


def test_odd_index_values_tolerated(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "odd_index")
    assert_ok(record)


@pytest.mark.parametrize("scenario", ["error_event", "legacy_error_event"])
def test_error_event_with_status_200_is_a_stream_error(stream_server: Any, scenario: str) -> None:
    record, _ = fetch(stream_server, scenario)
    assert record.status == 200
    assert record.error_kind == "stream_error"
    assert record.error_message is not None
    assert "says no" in record.error_message
    assert record.output_tokens == 2


def test_missing_done_is_truncated(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "no_done")
    assert record.error_kind == "truncated"
    assert record.output_tokens == 5


def test_connection_dropped_mid_stream_is_truncated(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "reset")
    assert record.error_kind == "truncated"
    assert record.output_tokens == 2


def test_non_json_data_is_a_protocol_error(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "non_json")
    assert record.error_kind == "protocol_error"
    assert record.error_message is not None
    assert "not json" in record.error_message


def test_json_instead_of_a_stream_is_a_protocol_error(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "json_body")
    assert record.error_kind == "protocol_error"


def test_http_500(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "status_500")
    assert record.status == 500
    assert record.error_kind == "http_5xx"
    assert record.error_message == "HTTP 500: status_500 says no"
    assert record.first_token_ns is None
    assert record.end_ns is not None


def test_http_429(stream_server: Any) -> None:
    record, _ = fetch(stream_server, "status_429")
    assert record.status == 429
    assert record.error_kind == "http_4xx"
    assert record.error_message == "HTTP 429: status_429 says no"


def test_slow_first_byte_is_in_ttft(stream_server: Any) -> None:
    record, _ = fetch(stream_server, x_first_delay_s=0.1)
    assert_ok(record)
    assert record.ttft_ns is not None
    assert record.ttft_ns >= 100 * MS


def test_stalled_stream_times_out(stream_server: Any) -> None:
    start = time.monotonic_ns()
    record, _ = fetch(stream_server, "hang", timeout_s=0.2)
    assert record.error_kind == "timeout"
    assert record.error_message is not None
    assert "0.2 s" in record.error_message
    assert record.output_tokens == 5  # what arrived before the stall is kept
    assert time.monotonic_ns() - start < 3_000 * MS


def test_slow_first_byte_beyond_timeout(stream_server: Any) -> None:
    record, _ = fetch(stream_server, x_first_delay_s=0.5, timeout_s=0.1)
    assert record.error_kind == "timeout"
    assert record.status is None


def test_connection_refused_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    target = Target("t", f"http://127.0.0.1:{port}")

    async def main() -> RequestRecord:
        async with make_client(target, 1) as client:
            return await send_request(client, target, RequestSpec(0, "x", 1), time.monotonic_ns())

    record = asyncio.run(main())
    assert record.error_kind == "connect"
    assert record.status is None
    assert record.end_ns is not None
    assert record.end_ns >= record.sent_ns


def test_connection_is_reused_after_done(stream_server: Any) -> None:
    """Draining after [DONE] keeps the connection alive, so later TTFTs carry no handshake."""

    async def main() -> list[RequestRecord]:
        async with stream_server() as server:
            target = Target("t", server.url)
            async with make_client(target, 1) as client:
                out = []
                for i in range(3):
                    spec = RequestSpec(i, PROMPT, 3)
                    out.append(await send_request(client, target, spec, time.monotonic_ns()))
            assert server.connections == 1
            return out

    for record in asyncio.run(main()):
        assert record.error_kind is None


def test_cancellation_propagates(stream_server: Any) -> None:
    async def main() -> None:
        async with stream_server() as server:
            target = Target("t", server.url)
            spec = RequestSpec(0, PROMPT, 3, {"x_first_delay_s": 5})
            async with make_client(target, 1) as client:
                task = asyncio.create_task(send_request(client, target, spec, 0))
                await server.request_seen.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    asyncio.run(main())


def test_unexpected_httpx_error_is_recorded_not_raised() -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.UnsupportedProtocol("nope")

    target = Target("t", "http://h:1")

    async def main() -> RequestRecord:
        async with httpx.AsyncClient(transport=httpx.MockTransport(boom)) as client:
            return await send_request(client, target, RequestSpec(0, "x", 1), 0)

    record = asyncio.run(main())
    assert record.error_kind == "connect"
    assert record.error_message is not None
    assert "UnsupportedProtocol" in record.error_message


def test_pool_exhaustion_is_a_timeout_that_blames_the_client(stream_server: Any) -> None:
    async def main() -> RequestRecord:
        async with stream_server() as server:
            patient = Target("t", server.url, timeout_s=5.0)
            hasty = Target("t", server.url, timeout_s=0.1)
            async with make_client(patient, 1) as client:
                hog = asyncio.create_task(
                    send_request(
                        client, patient, RequestSpec(0, PROMPT, 2, {"x_scenario": "hang"}), 0
                    )
                )
                await server.request_seen.wait()  # the only connection is now taken
                record = await send_request(client, hasty, RequestSpec(1, PROMPT, 2), 0)
                hog.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await hog
                return record

    record = asyncio.run(main())
    assert record.error_kind == "timeout"
    assert record.error_message is not None
    assert "client pool" in record.error_message


@pytest.mark.parametrize("lean", [True, False])
def test_request_id_header_and_both_transports_agree(stream_server: Any, lean: bool) -> None:
    """The lean transport and httpx's own give the same record for the same stream."""

    async def main() -> tuple[RequestRecord, Any]:
        async with stream_server() as server:
            target = Target("t", server.url)
            spec = RequestSpec(42, PROMPT, 4, {"return_token_ids": True, "x_token_delay_s": 0.002})
            async with make_client(target, 1, lean=lean) as client:
                return await send_request(client, target, spec, time.monotonic_ns()), server

    record, server = asyncio.run(main())
    assert_ok(record, tokens=4)
    assert record.token_ids == [100, 101, 102, 103]
    assert server.received[0].request_id == "42"
    # sent_ns is the socket write (lean) or just before httpx (default): before the server saw it.
    assert record.sent_ns <= server.received[0].at_ns


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_messages_and_history_shape_the_body(api: str) -> None:
    target = Target("t", "http://h:1", api=api)  # type: ignore[arg-type]
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    body = request_body(target, RequestSpec(0, "c", 1), history)
    if api == "chat":
        assert body["messages"] == [*history, {"role": "user", "content": "c"}]
    else:
        assert body["prompt"] == "a\n\nb\n\nc"
    spec = RequestSpec(0, "", 1, messages=({"role": "system", "content": "s"},))
    assert "messages" in request_body(Target("t", "http://h:1", api="chat"), spec)


@pytest.mark.parametrize("lean", [True, False])
def test_an_armed_request_leaves_at_its_instant_not_before(stream_server: Any, lean: bool) -> None:
    """Built ahead and fired on time: the bytes reach the server no earlier than the instant,
    and the record's send stamp is the instant the bytes left."""

    async def main() -> tuple[RequestRecord, Any, int]:
        async with stream_server() as server:
            target = Target("t", server.url)
            async with make_client(target, 2, lean=lean) as client:
                at = time.monotonic_ns() + 30 * MS
                spec = RequestSpec(1, PROMPT, 2, {})
                record = await send_request(client, target, spec, at, armed=True)
            return record, server, at

    record, server, at = asyncio.run(main())
    assert record.ok, record.error_message
    assert record.intended_ns == at
    assert server.received[0].at_ns >= at
    assert record.sent_ns >= at
    assert record.sent_ns - at < 20 * MS


def test_an_armed_request_cancelled_before_its_instant_never_leaves(stream_server: Any) -> None:
    async def main() -> Any:
        async with stream_server() as server:
            target = Target("t", server.url)
            async with make_client(target, 2) as client:
                spec = RequestSpec(1, PROMPT, 2, {})
                task = asyncio.create_task(
                    send_request(client, target, spec, time.monotonic_ns() + 50 * MS, armed=True)
                )
                await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.08)  # past the instant: nothing goes out
            return server

    server = asyncio.run(main())
    assert server.received == []


# -- the gate-set keys of a body; an uncompressed answer asked for on every request ------------


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_extra_never_replaces_the_keys_the_load_generator_sets(api: str) -> None:
    target = Target("t", "http://h:1", api=api, model="m")  # type: ignore[arg-type]
    hostile = {
        "model": "other",
        "prompt": "x " * 1000,
        "messages": [{"role": "system", "content": "y"}],
        "stream": False,
        "stream_options": {"include_usage": False},
        "max_tokens": 10**9,
        "max_completion_tokens": 10**9,
        "temperature": 0.5,
    }
    body = request_body(target, RequestSpec(0, "hi", 3, hostile))
    assert body["model"] == "m"
    assert body["max_tokens"] == 3
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "max_completion_tokens" not in body
    if api == "chat":
        assert body["messages"] == [{"role": "user", "content": "hi"}]
        assert "prompt" not in body
    else:
        assert body["prompt"] == "hi"
        assert "messages" not in body
    assert body["temperature"] == 0.5  # a sampling parameter still goes through


class HeaderServer:
    """A loopback HTTP/1.1 server that records each request's headers and answers with an
    empty event stream (or an empty model list)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []

    async def __aenter__(self) -> HeaderServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                headers = {}
                for f in fields:
                    if ":" in f:
                        name, value = f.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                await reader.readexactly(int(headers.get("content-length", "0")))
                method, path, _ = line.split(" ", 2)
                self.seen.append((f"{method} {path}", headers))
                if method == "GET":
                    payload, kind = b'{"data": []}', b"application/json"
                else:
                    payload, kind = b"data: [DONE]\n\n", b"text/event-stream"
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\n"
                    b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def test_every_request_to_an_engine_asks_for_an_uncompressed_answer() -> None:
    """Bodies are capped by their decoded bytes, so no engine may be invited to compress: the
    load path (lean transport), httpx's own transport, and the probes on a caller's client
    that would otherwise offer gzip all send `Accept-Encoding: identity`."""
    from loadgen.suite import run_probes

    async def main() -> HeaderServer:
        async with HeaderServer() as server:
            target = Target("t", server.url)
            for lean in (True, False):
                async with make_client(target, 2, lean=lean) as client:
                    await send_request(client, target, RequestSpec(0, "hi", 2), time.monotonic_ns())
            async with make_client(target, 2, lean=False) as client:  # the tokenizer's kind
                await client.post(server.url + "/tokenize", json={"prompt": "hi"})
            async with httpx.AsyncClient(trust_env=False) as plain:  # offers gzip by default
                await run_probes(target, client=plain)
            return server

    server = asyncio.run(main())
    assert len(server.seen) >= 4 + 14  # the sends, the tokenizer, the model list, the probes
    assert any(what.startswith("GET") for what, _ in server.seen)
    for what, headers in server.seen:
        assert headers.get("accept-encoding") == "identity", (what, headers)


class LateWrites:
    """A transport whose writes return `late_s` after the bytes left, as when another thread
    holds the GIL the socket call let go of."""

    def __init__(self, transport: Any, late_s: float) -> None:
        self._transport, self._late_s = transport, late_s

    def write(self, data: bytes) -> None:
        self._transport.write(data)
        time.sleep(self._late_s)  # the GIL held elsewhere; the server's thread answers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def test_the_send_stamp_is_not_delayed_by_a_thread_holding_the_gil(
    threaded_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket write lets go of the GIL; on a busy host another thread of the gate (the
    telemetry sampler) can keep it for tens of milliseconds before the loop's thread runs
    again, and a fast engine answers meanwhile. Here each write returns 60 ms late while the
    server (its own thread) answers: the send stamp is still taken before the server saw the
    request, and no TTFT is below zero (loadgen/connections.py `_write`; real vLLM on two busy
    cores gave a TTFT p50 of -0.8 ms with the stamp taken after the write)."""
    from loadgen import connections

    made = connections.Connection.connection_made

    def late_writes(self: Any, transport: Any) -> None:
        made(self, LateWrites(transport, 0.06))

    monkeypatch.setattr(connections.Connection, "connection_made", late_writes)

    async def main() -> RequestRecord:
        target = Target("t", threaded_server.url)
        spec = RequestSpec(7, PROMPT, 2, {})
        async with make_client(target, 1, lean=True) as client:
            return await send_request(client, target, spec, time.monotonic_ns())

    record = asyncio.run(main())
    assert record.ok, record.error_message
    assert record.sent_ns <= threaded_server.server.received[0].at_ns
    assert record.first_token_ns is not None and record.first_token_ns >= record.sent_ns
