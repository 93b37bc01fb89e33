"""Faults on demand, each seen the way a client sees it: real processes, real sockets.

Timing assertions are loose (the machine may be busy); where a test checks the performance
model itself it reads the model's own schedule from ``--truth-log``, which contention cannot
move.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from simengine.launch import SimPool, health_status

TINY = ("--profile", "tiny")
GREEDY = {"temperature": 0, "ignore_eos": True}


def _events(resp: httpx.Response) -> list[Any]:
    out: list[Any] = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def test_crash_after_seconds_cuts_streams_and_exits_1(launcher: SimPool) -> None:
    sim = launcher.start(*TINY, "--itl-ms", "10", "--crash-after-s", "1.0")
    ready = time.monotonic()
    received = 0
    body = {"prompt": "x", "max_tokens": 2000, "stream": True, **GREEDY}
    with (
        httpx.Client(base_url=sim.url, timeout=10) as client,
        client.stream("POST", "/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        with pytest.raises(httpx.TransportError):  # noqa: PT012
            for line in resp.iter_lines():
                received += line.startswith("data: {")
    assert 10 <= received < 2000  # it was mid-stream
    assert sim.proc.wait(timeout=10) == 1
    assert time.monotonic() - ready >= 0.9
    assert "--crash-after-s" in sim.stderr()


def test_hang_mid_stream_keeps_the_connection_open(launcher: SimPool, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    sim = launcher.start(
        *TINY, "--hang-after-tokens", "3", "--hang-requests", "2", "--truth-log", str(truth)
    )
    body = {"prompt": "x", "max_tokens": 20, "stream": True, **GREEDY}
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        first = client.post("/v1/completions", json=body)
        assert first.text.endswith("data: [DONE]\n\n")
        got = 0
        hung = httpx.Timeout(10.0, read=0.8)
        with client.stream("POST", "/v1/completions", json=body, timeout=hung) as resp:
            assert resp.status_code == 200
            with pytest.raises(httpx.ReadTimeout):  # noqa: PT012
                for line in resp.iter_lines():
                    got += line.startswith("data: {")
        assert got == 3
        third = client.post("/v1/completions", json=body)
        assert third.text.endswith("data: [DONE]\n\n")
    assert _metric(sim.url, "sim:hung_streams_total") == 1.0
    assert _metric(sim.url, "vllm:num_requests_running") == 0.0  # it left the batch
    sim.stop()
    records = sorted(_truth(truth), key=lambda r: r["arrival_ns"])  # written as they end
    assert [r["end"] for r in records] == ["done", "hang", "done"]
    hung = records[1]
    assert len(hung["events"]) == 3 and hung["end_ns"] >= hung["events"][-1][0]


def test_hang_rate_picks_a_seeded_share(launcher: SimPool) -> None:
    sim = launcher.start(
        *TINY, "--hang-after-tokens", "0", "--hang-rate", "0.5", "--seed", "4"
    )  # fmt: skip
    body = {"prompt": "x", "max_tokens": 2, "stream": True, **GREEDY}
    outcomes = []
    with httpx.Client(base_url=sim.url, timeout=httpx.Timeout(5.0, read=0.3)) as client:
        for _ in range(12):
            try:
                outcomes.append(client.post("/v1/completions", json=body).status_code)
            except httpx.ReadTimeout:
                outcomes.append("hung")
    assert 2 <= outcomes.count("hung") <= 10
    assert outcomes.count(200) == 12 - outcomes.count("hung")


def test_stream_error_event_then_done(launcher: SimPool, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    sim = launcher.start(
        *TINY, "--stream-error-rate", "0.5", "--seed", "2", "--truth-log", str(truth)
    )
    kinds = []
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        for i in range(16):
            body = {"prompt": "x", "max_tokens": 8, "stream": True, **GREEDY}
            headers = {"x-request-id": f"r{i}"}
            with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
                assert resp.status_code == 200
                events = _events(resp)
            assert events[-1] == "[DONE]"
            errors = [e for e in events[:-1] if "error" in e]
            if errors:
                (error,) = errors
                assert events[-2] is error  # the error is the last event before [DONE]
                assert set(error["error"]) == {"message", "type", "param", "code"}
                assert error["error"]["type"] == "BadRequestError"
                content = events[:-2]
                assert 1 <= len(content) <= 7  # mid-stream: after some tokens, before the end
                kinds.append("error")
            else:
                assert len(events) == 9
                kinds.append("ok")
    assert 3 <= kinds.count("error") <= 13
    assert _metric(sim.url, "sim:stream_errors_total") == kinds.count("error")
    sim.stop()
    # The ground truth says how each stream ended, and when: after its last content event.
    ends = {rec["request_id"]: rec for rec in _truth(truth)}
    assert [ends[f"r{i}"]["end"] for i in range(16)] == [
        "error" if k == "error" else "done" for k in kinds
    ]
    for rec in ends.values():
        assert rec["status"] == 200 and rec["end_ns"] >= rec["events"][-1][0]


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_long_slow_start_is_interruptible(launcher: SimPool, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = launcher.spawn("--load-s", "600", "--warmup-s", "600", port=port)
    # Its signal handlers are set before it says it is loading (a fixed sleep raced a slow
    # start on a busy machine: SIGTERM came before them and killed it, -15).
    stderr = tmp_path / "sim-0.stderr"
    deadline = time.monotonic() + 60
    while "sim: loading weights" not in stderr.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None
        time.sleep(0.05)
    assert "sim: loading weights" in stderr.read_text()
    assert proc.poll() is None
    assert _closed(port)  # still "loading weights"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0

    warming = launcher.start("--load-s", "0", "--warmup-s", "600", ready=False)
    assert health_status(warming.url) == 503
    warming.proc.send_signal(signal.SIGTERM)
    assert warming.proc.wait(timeout=5) == 0


def _truth(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# serial: the steps' stretch is measured on the wall clock, which other processes stretch too.
@pytest.mark.serial
def test_degradation_stretches_steps_over_time(launcher: SimPool, tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    # 100% of the start step time per second: 5 ms steps at first, ~2.5x after 1.5 s.
    sim = launcher.start(
        *TINY, "--itl-ms", "5", "--degrade-itl-per-min", "6000", "--truth-log", str(truth)
    )
    body = {"prompt": "x", "max_tokens": 10, "stream": True, **GREEDY}
    seen: dict[str, float] = {}  # what a client measures: mean gap between token events

    def stream(rid: str) -> None:
        stamps = []
        with client.stream(
            "POST", "/v1/completions", json=body, headers={"x-request-id": rid}
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.perf_counter())
        seen[rid] = (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3

    with httpx.Client(base_url=sim.url, timeout=10) as client:
        stream("a")
        time.sleep(1.5)
        stream("b")
    sim.stop()
    gaps = {}
    for rec in _truth(truth):
        s = rec["scheduled_ns"]
        gaps[rec["request_id"]] = (s[-1] - s[0]) / (len(s) - 1) / 1e6
    assert 4.5 <= gaps["a"] <= 8
    assert gaps["b"] / gaps["a"] >= 1.8
    # The client sees the same stretch: inter-token latency grew with the engine's age.
    assert 4.0 <= seen["a"] <= 9
    assert seen["b"] / seen["a"] >= 1.7


@pytest.mark.parametrize("status", [429, 503])
def test_shedding_answers_with_a_vllm_style_error(launcher: SimPool, status: int) -> None:
    sim = launcher.start(
        *TINY, "--itl-ms", "20", "--max-num-seqs", "1", "--max-waiting", "1",
        "--shed-status", str(status),
    )  # fmt: skip
    body = json.dumps({"prompt": "x", "max_tokens": 30, "stream": True, **GREEDY}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body)
    )
    socks = []
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
        s.sendall(request)
        socks.append(s)
        time.sleep(0.05)  # in order: one runs, one waits, the rest are shed
    answers = []
    for s in socks:
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        answers.append(data)
    codes = [int(a.split(b" ", 2)[1]) for a in answers]
    assert codes[:2] == [200, 200]
    assert codes[2:] == [status] * 3
    error = json.loads(answers[-1].split(b"\r\n\r\n", 1)[1])["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert error["type"] == ("TooManyRequestsError" if status == 429 else "ServiceUnavailableError")
    assert _metric(sim.url, "sim:shed_requests_total") == 3.0
