"""The sim ends connections the ways real servers do, over real sockets to a real process.

The two habits it copies, from their sources:
- uvicorn, which serves vLLM, announces nothing: ``timeout_keep_alive`` defaults to 5 s
  (encode/uvicorn@e6c7ce7 ``uvicorn/config.py`` line 214), its timer is set when a response
  completes (``uvicorn/protocols/http/h11_impl.py`` line 318), stopped by any byte received
  (line 169), and ``timeout_keep_alive_handler`` (line 351) closes the transport without a
  word to the client.
- cpp-httplib, inside llama.cpp's server, serves at most ``keep_alive_max_count`` (100)
  requests per connection, the last one flagged ``close_connection``
  (yhirose/cpp-httplib@6494edd ``httplib.h`` lines 6297-6303), and says so on every
  response: ``Connection: close`` on that last one, else ``Keep-Alive: timeout=5, max=100``,
  the limit repeated, not counted down (lines 12629-12639; the same header as in
  ``../shared/captures/llamacpp-health.http``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from loadgen.transport import LoadgenTransport
from simengine.cli import parse_args
from simengine.http11 import ConnectionHabits
from simengine.launch import SimHandle, SimPool

FAST = ("--profile", "tiny")


class Raw:
    """One client connection read by hand, so every header and the close itself are seen."""

    def __init__(self, sim: SimHandle) -> None:
        self.sock = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
        self.buf = b""

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _fill(self) -> bool:
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        self.buf += chunk
        return bool(chunk)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def health(self) -> tuple[str, dict[str, str]] | None:
        self.send(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        return self.response()

    def response(self) -> tuple[str, dict[str, str]] | None:
        """The next response's status line and headers, its body read; None: the server
        closed the connection without a byte of one."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                assert self.buf == b"", self.buf
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        if headers.get("transfer-encoding") == "chunked":
            while b"\r\n0\r\n\r\n" not in b"\r\n" + self.buf:
                assert self._fill(), "stream cut short"
            self.buf = self.buf.split(b"0\r\n\r\n", 1)[1]
        else:
            n = int(headers.get("content-length", "0"))
            while len(self.buf) < n:
                assert self._fill(), "body cut short"
            self.buf = self.buf[n:]
        return status, headers

    def closed_within(self, seconds: float) -> float | None:
        """When (time.monotonic()) the server closed the idle connection, waiting at most
        ``seconds``; None if it stayed open."""
        self.sock.settimeout(seconds)
        try:
            if self._fill():
                raise AssertionError(f"bytes nobody asked for: {self.buf!r}")
        except TimeoutError:
            return None
        finally:
            self.sock.settimeout(10)
        return time.monotonic()


def metric(sim: SimHandle, name: str) -> float:
    for line in httpx.get(sim.url + "/metrics").text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_flags_reach_the_config() -> None:
    flags = "--keep-alive-timeout 5 --max-requests-per-connection 100 --announce-keep-alive"
    config = parse_args(["--port", "0", *flags.split(" ")])
    assert config.keep_alive_timeout_s == 5.0
    assert config.max_requests_per_connection == 100
    assert config.announce_keep_alive is True
    plain = parse_args(["--port", "0"])
    assert (plain.keep_alive_timeout_s, plain.max_requests_per_connection) == (None, None)
    assert plain.announce_keep_alive is False


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--keep-alive-timeout 0", "--keep-alive-timeout must be a finite number of seconds > 0"),
        ("--keep-alive-timeout -1", "--keep-alive-timeout must be a finite number of seconds"),
        ("--keep-alive-timeout inf", "--keep-alive-timeout must be a finite number of seconds"),
        ("--keep-alive-timeout nan", "--keep-alive-timeout must be a finite number of seconds"),
        ("--max-requests-per-connection 0", "--max-requests-per-connection must be >= 1, got 0"),
        ("--announce-keep-alive", "--announce-keep-alive has nothing to announce"),
    ],
)
def test_bad_values_are_named(flags: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--port", "0", *flags.split()])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("timeout", "limit", "header"),
    [(5.0, 100, "timeout=5, max=100"), (0.5, None, "timeout=0"), (None, 7, "max=7")],
)
def test_what_is_announced(timeout: float | None, limit: int | None, header: str) -> None:
    habits = ConnectionHabits(idle_timeout_s=timeout, max_requests=limit, announce=True)
    assert habits.keep_alive_header() == header
    assert ConnectionHabits(timeout, limit).keep_alive_header() is None  # silent


def test_announced_limit_says_keep_alive_then_close(launcher: SimPool) -> None:
    sim = launcher.start(
        *FAST, "--max-requests-per-connection", "3", "--keep-alive-timeout", "5.9",
        "--announce-keep-alive",
    )  # fmt: skip
    with Raw(sim) as c:
        for _ in range(2):
            answer = c.health()
            assert answer is not None
            status, headers = answer
            assert status == "HTTP/1.1 200 OK"
            assert headers["keep-alive"] == "timeout=5, max=3"  # whole seconds, rounded down
            assert "connection" not in headers
        answer = c.health()
        assert answer is not None
        assert answer[1]["connection"] == "close" and "keep-alive" not in answer[1]
        assert c.closed_within(3.0) is not None  # and it is closed
    assert metric(sim, 'sim:connections_closed_total{reason="limit"') == 1
    assert metric(sim, "sim:requests_dropped_total") == 0


def test_silent_limit_closes_on_the_next_request_unanswered(launcher: SimPool) -> None:
    sim = launcher.start(*FAST, "--max-requests-per-connection", "2")
    with Raw(sim) as c:
        for _ in range(2):
            answer = c.health()
            assert answer is not None
            assert "keep-alive" not in answer[1] and "connection" not in answer[1]
        assert c.closed_within(0.3) is None  # nothing says the connection is spent
        assert c.health() is None  # until a request goes out on it
    assert metric(sim, "sim:requests_dropped_total") == 1
    assert metric(sim, 'sim:connections_closed_total{reason="limit"') == 1


def test_a_pipelined_request_past_the_limit_is_not_answered(launcher: SimPool) -> None:
    sim = launcher.start(*FAST, "--max-requests-per-connection", "2")
    with Raw(sim) as c:
        c.send(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n" * 3)
        assert c.response() is not None and c.response() is not None
        assert c.response() is None


@pytest.mark.parametrize("announce", [False, True])
def test_idle_connections_close_after_the_timeout(launcher: SimPool, announce: bool) -> None:
    sim = launcher.start(
        *FAST, "--keep-alive-timeout", "1.5", *(["--announce-keep-alive"] if announce else [])
    )
    with Raw(sim) as c:
        # Requests 0.3 s apart keep it open well past 1.5 s: the clock restarts after each.
        for i in range(8):
            if i:
                time.sleep(0.3)
            answer = c.health()
            assert answer is not None
            assert answer[1].get("keep-alive") == ("timeout=1" if announce else None)
        answered = time.monotonic()
        closed = c.closed_within(10.0)
        # The server's clock started when it wrote the answer, before we read it.
        assert closed is not None and 1.0 < closed - answered < 5.0
    with Raw(sim) as c:  # a connection that never sends a request is idle too
        opened = time.monotonic()
        closed = c.closed_within(10.0)
        assert closed is not None and 1.0 < closed - opened < 8.0
    assert metric(sim, 'sim:connections_closed_total{reason="idle"') == 2


def test_a_stream_longer_than_the_idle_timeout_is_not_cut(launcher: SimPool) -> None:
    sim = launcher.start(*FAST, "--itl-ms", "25", "--keep-alive-timeout", "0.5")
    body = json.dumps(
        {"prompt": "a", "max_tokens": 40, "stream": True, "temperature": 0, "ignore_eos": True}
    ).encode()
    with Raw(sim) as c:
        start = time.monotonic()
        c.send(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        answer = c.response()  # the whole stream, 40 events 25 ms apart
        assert answer is not None and answer[0] == "HTTP/1.1 200 OK"
        assert time.monotonic() - start > 0.5
        assert c.health() is not None  # and the connection is still open


@pytest.mark.parametrize("announce", [False, True])
def test_loadgen_through_one_connection_slot(launcher: SimPool, announce: bool) -> None:
    """Ten requests through a one-connection pool to a sim that serves three per connection:
    announced, the pool retires each connection after its third; silent, the fourth request
    on each connection is closed unanswered and sent once more on a fresh one. Either way all
    ten come back, and every resend is a request the sim dropped."""
    announced = ["--announce-keep-alive"] if announce else []
    sim = launcher.start(*FAST, "--max-requests-per-connection", "3", *announced)

    async def go() -> tuple[int, int]:
        transport = LoadgenTransport(max_connections=1)
        async with httpx.AsyncClient(transport=transport, base_url=sim.url) as client:
            ok = 0
            for _ in range(10):
                r = await client.get("/health")
                ok += r.status_code == 200
        return ok, transport.resent

    ok, resent = asyncio.run(go())
    dropped = metric(sim, "sim:requests_dropped_total")
    assert ok == 10
    assert resent == dropped == (0 if announce else 3)  # requests 4, 7 and 10 went twice
    assert metric(sim, 'sim:connections_closed_total{reason="limit"') == 3
