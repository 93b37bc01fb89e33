"""Process-level behaviour: startup phases, timing, reproducibility, faults and signals."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import socket
import statistics
import threading
import time
from typing import Any

import httpx
import pytest

from simengine.launch import SimPool, health_status, read_announcement

FAST = ("--load-s", "0", "--warmup-s", "0", "--ttft-ms", "5", "--itl-ms", "1")
GREEDY = {"temperature": 0, "ignore_eos": True}
PROMPTS = ["hello world", "the quick brown fox", "a", "one two three four five six seven"]


def _outputs(url: str) -> list[tuple[str, str]]:
    out = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": 20, **GREEDY}
            text = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
            chat_body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 20}
            chat = client.post("/v1/chat/completions", json={**chat_body, **GREEDY}).json()
            out.append((text, chat["choices"][0]["message"]["content"]))
    return out


def test_greedy_output_is_identical_across_processes(launcher: SimPool) -> None:
    a = launcher.start(*FAST, "--seed", "1")
    # Different jitter seed and chunking: same weights, so the same text.
    b = launcher.start(*FAST, "--seed", "2", "--jitter", "0.2", "--tokens-per-event", "3")
    other = launcher.start(*FAST, "--model-seed", "9")
    assert _outputs(a.url) == _outputs(b.url)
    assert _outputs(a.url) != _outputs(other.url)

    with (
        httpx.Client(base_url=b.url) as client,
        client.stream(
            "POST",
            "/v1/completions",
            json={
                "prompt": "x",
                "max_tokens": 7,
                "stream": True,
                "return_token_ids": True,
                **GREEDY,
            },
        ) as resp,
    ):
        sizes = [
            len(json.loads(line[6:])["choices"][0]["token_ids"])
            for line in resp.iter_lines()
            if line.startswith("data: {")
        ]
    assert sizes == [3, 3, 1]


def _timed_stream(client: httpx.Client, body: dict[str, Any]) -> list[float]:
    """Arrival time of each data event, relative to the send."""
    stamps: list[float] = []
    start = time.perf_counter()
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter() - start)
    return stamps


def test_client_sees_configured_ttft_and_itl(launcher: SimPool) -> None:
    sim = launcher.start(
        "--load-s", "0", "--warmup-s", "0", "--ttft-ms", "60", "--prefill-us-per-token", "1000",
        "--itl-ms", "15", "--jitter", "0.03",
    )  # fmt: skip
    prompt = " ".join(["w"] * 40)  # 40 tokens: 40 ms of prefill
    expected_ttft = 0.060 + 0.040
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        client.post("/v1/completions", json={"prompt": "warm", "max_tokens": 1})
        runs = [
            _timed_stream(client, {"prompt": prompt, "max_tokens": 8, **GREEDY}) for _ in range(3)
        ]
    ttft = statistics.median(r[0] for r in runs)
    assert 0.8 * expected_ttft <= ttft <= 2 * expected_ttft
    gaps = [b - a for r in runs for a, b in itertools.pairwise(r)]
    assert 0.8 * 0.015 <= statistics.median(gaps) <= 2 * 0.015
    # Absolute deadlines: the whole stream does not drift beyond its schedule.
    total = statistics.median(r[-1] for r in runs)
    assert total <= expected_ttft + 7 * 0.015 + 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_startup_phases(launcher: SimPool) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = launcher.spawn("--load-s", "0.6", "--warmup-s", "0.6", port=port)
    time.sleep(0.25)
    assert health_status(url) is None  # still "loading weights": the port is closed
    announced, bound = read_announcement(proc, timeout=10)
    assert (announced, bound) == (url, port)
    opened = time.monotonic()
    assert health_status(url) == 503
    with httpx.Client(base_url=url) as client:
        resp = client.post("/v1/completions", json={"prompt": "x"})
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == 503
        assert client.get("/metrics").status_code == 200
    while health_status(url) != 200:
        assert time.monotonic() - opened < 10
        time.sleep(0.02)
    assert time.monotonic() - opened >= 0.4
    proc.terminate()
    assert proc.wait(timeout=5) == 0
    stderr = launcher.handles[-1].stderr()
    phases = ["sim: loading weights", "sim: warming up", f"sim: ready on {url}"]
    positions = [stderr.index(p) for p in phases]
    assert positions == sorted(positions)


# serial: a start-up time on the wall clock.
@pytest.mark.serial
def test_process_listens_quickly(launcher: SimPool) -> None:
    started = time.monotonic()
    proc = launcher.spawn("--load-s", "0", "--warmup-s", "0")
    read_announcement(proc, timeout=10)
    # The brief is < 0.5 s; leave room for a loaded CI machine.
    assert time.monotonic() - started < 1.5


def test_crash_after_requests_kills_streams_mid_flight(launcher: SimPool) -> None:
    sim = launcher.start(*FAST, "--itl-ms", "20", "--crash-after-requests", "1")
    body = {"prompt": "x", "max_tokens": 500, "stream": True, **GREEDY}
    received = 0
    with (
        httpx.Client(base_url=sim.url, timeout=10) as client,
        client.stream("POST", "/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        with pytest.raises(httpx.TransportError):  # noqa: PT012
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    received += 1
                    if received == 2:
                        # Request 2 starts streaming, and the engine dies.
                        threading.Thread(target=_fire_and_forget, args=(sim.url,)).start()
    assert 2 <= received < 500
    assert sim.proc.wait(timeout=10) == 1
    assert "crashing" in sim.stderr()


def _fire_and_forget(url: str) -> None:
    body = {"prompt": "y", "max_tokens": 5, "stream": True}
    try:
        with httpx.Client(base_url=url, timeout=5) as client:
            client.post("/v1/completions", json=body)
    except httpx.TransportError:
        pass


def test_error_rate_answers_some_requests_with_500(launcher: SimPool) -> None:
    sim = launcher.start(*FAST, "--error-rate", "0.5", "--seed", "3")
    statuses = []
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        for _ in range(40):
            resp = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
            statuses.append(resp.status_code)
            if resp.status_code == 500:
                error = resp.json()["error"]
                assert (error["type"], error["code"]) == ("InternalServerError", 500)
        assert client.get("/health").status_code == 200  # health is not a victim
        metrics = client.get("/metrics").text
    injected = f'sim:injected_errors_total{{model_name="demo-model"}} {float(statuses.count(500))}'
    assert injected in metrics
    assert set(statuses) == {200, 500}
    assert 8 <= statuses.count(500) <= 32


def test_sigterm_exits_zero_promptly_even_mid_stream(launcher: SimPool) -> None:
    idle = launcher.start(*FAST)
    idle.proc.send_signal(signal.SIGTERM)
    assert idle.proc.wait(timeout=5) == 0

    busy = launcher.start(*FAST, "--itl-ms", "50")
    with (
        httpx.Client(base_url=busy.url, timeout=10) as client,
        client.stream(
            "POST", "/v1/completions", json={"prompt": "x", "max_tokens": 1000, "stream": True}
        ) as resp,
    ):
        next(line for line in resp.iter_lines() if line.startswith("data: "))
        sent = time.monotonic()
        busy.proc.send_signal(signal.SIGINT)
        assert busy.proc.wait(timeout=5) == 0
        assert time.monotonic() - sent < 2
    assert "sim: shutting down" in busy.stderr()


def test_bad_flags_exit_with_usage_error(launcher: SimPool) -> None:
    proc = launcher.spawn("--error-rate", "2")
    assert proc.wait(timeout=10) == 2


async def _count_events(port: int, body: bytes, streams: int) -> int:
    request = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )

    async def one() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            chunk = await reader.read(65536)
            assert chunk, "stream ended early"
            data += chunk
        writer.close()
        return data.count(b"data: {")

    counts = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(counts)


# serial: a throughput on the wall clock, for the cores to itself.
@pytest.mark.serial
def test_sustains_thousands_of_events_per_second(launcher: SimPool) -> None:
    sim = launcher.start(
        "--load-s", "0", "--warmup-s", "0", "--ttft-ms", "10", "--itl-ms", "10",
        "--itl-per-running-ms", "0", "--jitter", "0",
    )  # fmt: skip
    streams, tokens = 40, 60
    body = json.dumps({"prompt": "x", "max_tokens": tokens, "stream": True, **GREEDY}).encode()
    started = time.perf_counter()
    events = asyncio.run(_count_events(sim.port, body, streams))
    elapsed = time.perf_counter() - started
    assert events == streams * tokens
    ideal = 0.010 + (tokens - 1) * 0.010  # 4,000 events/s if the schedule is kept
    assert elapsed < ideal * 1.5, f"{events / elapsed:.0f} events/s"


def _model_timings(truth: Any) -> tuple[float, float]:
    """Median TTFT and inter-event gap, in ms, as the performance model scheduled them."""
    ttfts, gaps = [], []
    for line in truth.read_text().splitlines():
        rec = json.loads(line)
        sched = rec["scheduled_ns"]
        ttfts.append((sched[0] - rec["arrival_ns"]) / 1e6)
        gaps.extend((b - a) / 1e6 for a, b in itertools.pairwise(sched))
    return statistics.median(ttfts), statistics.median(gaps)


def test_ttft_flag_moves_ttft_and_leaves_itl(launcher: SimPool, tmp_path: Any) -> None:
    """The demo's regression: --ttft-ms 60 against 40 raises TTFT ~1.4x, ITL unchanged."""
    timings = {}
    for ttft in ("40", "60"):
        truth = tmp_path / f"truth-{ttft}.jsonl"
        sim = launcher.start(
            "--load-s", "0", "--warmup-s", "0", "--ttft-ms", ttft, "--truth-log", str(truth)
        )  # fmt: skip
        with httpx.Client(base_url=sim.url, timeout=10) as client:
            body = {"prompt": " ".join(["w"] * 128), "max_tokens": 6, "stream": True, **GREEDY}
            for _ in range(6):
                client.post("/v1/completions", json=body)
        sim.stop()
        timings[ttft] = _model_timings(truth)
    (ttft40, itl40), (ttft60, itl60) = timings["40"], timings["60"]
    # TTFT = --ttft-ms + 50 us per prompt token (6.4 ms), jittered by 3%.
    assert ttft40 == pytest.approx(46.4, rel=0.1)
    assert ttft60 == pytest.approx(66.4, rel=0.1)
    assert itl40 == pytest.approx(12.0, rel=0.1)
    assert itl60 == pytest.approx(itl40, rel=0.1)
