"""A tiny OpenAI-style streaming server that misbehaves on demand, for testing the client for real.

The request body picks the behaviour, so one server covers every variation and the client is
exercised through ``RequestSpec.extra`` exactly as the gate will use it:

- ``x_scenario``: see ``SCENARIOS``;
- ``x_token_delay_s``: pause before each event after the first (simulated decode time);
- ``x_first_delay_s``: pause before the first response byte (simulated queue + prefill).

It speaks just enough HTTP/1.1 (keep-alive, chunked responses) to be driven by httpx, and counts
requests in flight so closed-loop tests can check the concurrency a target really saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

SCENARIOS = (
    "basic",  # one token per event, continuous usage, usage-only final chunk, [DONE]
    "comments",  # keep-alive comments between and inside events
    "crlf",  # \r\n line endings
    "multi_token",  # three tokens per event, usage deltas tell
    "multi_token_ids",  # three tokens per event, no usage at all, token_ids tell
    "multi_token_bare",  # three tokens per event and nothing that says so
    "no_usage",  # no usage anywhere: client falls back to one token per event
    "final_usage_only",  # usage only in the final choices-less chunk
    "empty_chunks",  # events with empty text between tokens
    "odd_index",  # index counts chunks instead of choices
    "error_event",  # HTTP 200, two tokens, then {"error": ...} and [DONE]
    "legacy_error_event",  # older vLLM: {"object": "error", "message": ...}
    "no_done",  # clean end of body without [DONE]
    "reset",  # connection dropped mid-stream
    "non_json",  # data that is not JSON
    "status_500",
    "status_429",
    "json_body",  # 200 with a non-streaming JSON body
    "hang",  # headers, then nothing until the server closes
    "split",  # every event written in three pieces, cut mid-line
    "multiline_data",  # one JSON object spread over several data: lines
)


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    at_ns: int
    request_id: str | None = None  # the X-Request-Id header


@dataclass
class _Plan:
    status: int = 200
    content_type: str = "text/event-stream"
    first_delay_s: float = 0.0
    token_delay_s: float = 0.0
    writes: list[bytes] = field(default_factory=list)
    ending: str = "end"  # end | reset | hang


class StreamServer:
    """Async context manager; run it in the test's own event loop so timing is not skewed by a
    second thread competing for the GIL."""

    def __init__(self, *, first_delay_s: float = 0.0, token_delay_s: float = 0.0) -> None:
        """Delays given here apply when the request body does not set its own."""
        self.first_delay_s = first_delay_s
        self.token_delay_s = token_delay_s
        self.received: list[Received] = []
        self.request_seen = asyncio.Event()
        self.connections = 0
        self.active = 0
        self.max_active = 0
        self._closing = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> StreamServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            while not self._closing.is_set():
                request = await _read_request(reader)
                if request is None:
                    break
                self.received.append(request)
                self.request_seen.set()
                self.active += 1
                self.max_active = max(self.max_active, self.active)
                try:
                    keep_open = await self._respond(request, writer)
                finally:
                    self.active -= 1
                if not keep_open:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.transport.abort()

    async def _respond(self, request: Received, writer: asyncio.StreamWriter) -> bool:
        plan = _plan(request, self.first_delay_s, self.token_delay_s)
        if plan.first_delay_s:
            await asyncio.sleep(plan.first_delay_s)
        if plan.status != 200 or plan.content_type != "text/event-stream":
            body = plan.writes[0]
            writer.write(
                f"HTTP/1.1 {plan.status} X\r\ncontent-type: {plan.content_type}\r\n"
                f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
        )
        await writer.drain()
        for i, data in enumerate(plan.writes):
            if i and plan.token_delay_s:
                await asyncio.sleep(plan.token_delay_s)
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()
        if plan.ending == "reset":
            writer.transport.abort()
            return False
        if plan.ending == "hang":
            await self._closing.wait()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    at_ns = time.monotonic_ns()
    lines = head.decode("latin-1").split("\r\n")
    _method, path, _version = lines[0].split(" ", 2)
    length = 0
    request_id = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        elif name.strip().lower() == "x-request-id":
            request_id = value.strip()
    raw = await reader.readexactly(length) if length else b"{}"
    return Received(path=path, body=json.loads(raw), at_ns=at_ns, request_id=request_id)


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _plan(request: Received, first_delay_s: float, token_delay_s: float) -> _Plan:
    body = request.body
    scenario = body.get("x_scenario", "basic")
    chat = request.path.endswith("/chat/completions")
    plan = _Plan(
        first_delay_s=float(body.get("x_first_delay_s", first_delay_s)),
        token_delay_s=float(body.get("x_token_delay_s", token_delay_s)),
    )
    error = {"error": {"message": f"{scenario} says no", "type": "X", "param": None, "code": 0}}
    if scenario == "status_500":
        plan.status, plan.content_type = 500, "application/json"
        plan.writes = [json.dumps(error).encode()]
        return plan
    if scenario == "status_429":
        plan.status, plan.content_type = 429, "application/json"
        plan.writes = [json.dumps(error).encode()]
        return plan
    if scenario == "json_body":
        plan.content_type = "application/json"
        plan.writes = [json.dumps({"choices": [{"text": "all at once"}]}).encode()]
        return plan

    n = int(body.get("max_tokens", 4))
    prompt = body.get("prompt") or body["messages"][0]["content"]
    prompt_tokens = len(prompt.split())
    per_event = 3 if scenario.startswith("multi_token") else 1
    stream_options = body.get("stream_options") or {}
    bare = ("no_usage", "multi_token_ids", "multi_token_bare")
    continuous = bool(stream_options.get("continuous_usage_stats")) and scenario not in (
        (*bare, "final_usage_only")
    )
    final_usage = scenario not in bare
    with_ids = bool(body.get("return_token_ids")) or scenario == "multi_token_ids"
    with_logprobs = body.get("logprobs") not in (None, False)

    events: list[bytes] = []

    def usage(done: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": done,
            "total_tokens": prompt_tokens + done,
        }

    if chat:
        role: dict[str, Any] = {
            "object": "chat.completion.chunk",
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if continuous:
            role["usage"] = usage(0)
        events.append(_event(role))

    done = 0
    chunk_no = 0
    while done < n:
        k = min(per_event, n - done)
        ids = list(range(100 + done, 100 + done + k))
        words = [f"w{i}" for i in range(done, done + k)]
        text = "".join(f" {w}" for w in words)
        lps = [-0.5 - 0.01 * i for i in range(done, done + k)]
        done += k
        last = done == n
        choice: dict[str, Any] = {"index": chunk_no if scenario == "odd_index" else 0}
        if chat:
            choice["delta"] = {"content": text}
            choice["logprobs"] = (
                {"content": [{"token": w, "logprob": lp} for w, lp in zip(words, lps, strict=True)]}
                if with_logprobs
                else None
            )
        else:
            choice["text"] = text
            choice["logprobs"] = (
                {"tokens": words, "token_logprobs": lps, "top_logprobs": None}
                if with_logprobs
                else None
            )
        choice["finish_reason"] = "length" if last else None
        if with_ids:
            choice["token_ids"] = ids
        obj: dict[str, Any] = {
            "id": "x",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "choices": [choice],
        }
        if continuous:
            obj["usage"] = usage(done)
        events.append(_event(obj))
        chunk_no += 1
        if scenario == "empty_chunks" and not last:
            empty = dict(choice, text="") if not chat else dict(choice, delta={"content": ""})
            empty.pop("token_ids", None)
            empty["logprobs"] = None
            blank: dict[str, Any] = {"id": "x", "choices": [empty]}
            if continuous:
                blank["usage"] = usage(done)
            events.append(_event(blank))
        if scenario in ("error_event", "legacy_error_event", "non_json", "reset") and done >= 2:
            break
    if scenario == "error_event":
        events.append(_event(error))
    elif scenario == "legacy_error_event":
        events.append(_event({"object": "error", "message": "legacy says no", "code": 500}))
    elif scenario == "non_json":
        events.append(b"data: this is not json\n\n")
    if final_usage and scenario not in ("reset", "hang"):
        events.append(_event({"id": "x", "choices": [], "usage": usage(done)}))
    if scenario not in ("no_done", "reset", "hang"):
        events.append(b"data: [DONE]\n\n")

    if scenario == "comments":
        events = [b": ping\n\n" + e.replace(b"data: ", b": inside\ndata: ", 1) for e in events]
    elif scenario == "crlf":
        events = [e.replace(b"\n", b"\r\n") for e in events]
    elif scenario == "multiline_data":
        events = [_multiline(e) for e in events]
    if scenario == "split":
        plan.writes = [piece for e in events for piece in _thirds(e)]
    else:
        plan.writes = events
    plan.ending = {"reset": "reset", "hang": "hang"}.get(scenario, "end")
    return plan


def _multiline(event: bytes) -> bytes:
    """Spread a JSON payload over several ``data:`` lines (joined with \\n, still valid JSON)."""
    payload = event[len(b"data: ") : -2]
    if not payload.startswith(b"{"):
        return event
    parts = payload.split(b", ")
    lines = [b"data: " + p + b"," for p in parts[:-1]] + [b"data: " + parts[-1]]
    return b"\n".join(lines) + b"\n\n"


def _thirds(event: bytes) -> list[bytes]:
    a, b = len(event) // 3, 2 * len(event) // 3
    return [event[:a], event[a:b], event[b:]]


@pytest.fixture
def stream_server() -> Callable[..., StreamServer]:
    """The server class; start it inside the test's event loop with ``async with``."""
    return StreamServer


@dataclass
class ThreadedServer:
    url: str
    server: StreamServer


@contextlib.contextmanager
def _threaded() -> Iterator[ThreadedServer]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        async with StreamServer() as server:
            box["server"] = server
            box["stop"] = asyncio.Event()
            ready.set()
            await box["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "test server did not start"
    try:
        yield ThreadedServer(url=box["server"].url, server=box["server"])
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)
        loop.close()


@pytest.fixture
def threaded_server() -> Iterator[ThreadedServer]:
    """For code that runs its own event loop (the CLI): the server lives in a second thread."""
    with _threaded() as server:
        yield server


# --------------------------------------------------------------------------- the real sim engine
# Started as a process (``python -m simengine``), never imported: loadgen and its tests
# must not depend on ``gate`` as a library.

FAST = ["--load-s", "0", "--warmup-s", "0", "--ttft-ms", "2", "--itl-ms", "1", "--jitter", "0"]


@contextlib.contextmanager
def _sim(*args: str, timeout_s: float = 60.0) -> Iterator[str]:
    """Yield the base URL of a running sim; stop it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "simengine", "--port", "0", *FAST, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                url = match.group(1)
        assert url is not None, "the sim did not announce its port"
        _wait_ready(url, deadline)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait_ready(url: str, deadline: float) -> None:
    import httpx

    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError("the sim never became healthy")


@pytest.fixture
def sim() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """``with sim(*flags) as url``: a fast, jitter-free sim engine on a free port."""
    return _sim
