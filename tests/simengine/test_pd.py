"""A disaggregated sim end to end: prefill and decode workers and the router, real processes
over real HTTP, against a whole sim (``--role both``) with the same settings.

The split follows vLLM's proxy for its KV connectors,
vllm-project/vllm ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``: the request
goes to a prefill worker with ``max_tokens: 1``, ``stream: false`` and ``kv_transfer_params:
{do_remote_decode: true}``; the ``kv_transfer_params`` of its answer go with the client's own
request to a decode worker, whose answer is the client's. (SGLang's router instead sends the
request to both at once and the workers meet through a bootstrap room; the sequential split is
the simpler of the two and gives the same client-visible shape: TTFT = prefill + transfer +
a decode step.)

Timing is asserted only as lower bounds that the configured delays guarantee, and upper bounds
only far below a timeout the test sets, so a busy two-core machine cannot fail them.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gate.engines.lifecycle import ENDPOINT_PHASES, Clock, PhaseLog
from gate.engines.readiness import wait_ready
from simengine.launch import ROUTER_MODULE, PdSim, SimHandle, SimPool, health_status
from simengine.router import RouterConfig, parse_args, prefill_body

REPO_ROOT = Path(__file__).resolve().parents[2]

FAST = ("--load-s", "0", "--warmup-s", "0", "--ttft-ms", "5", "--itl-ms", "1", "--jitter", "0")
GREEDY = {"temperature": 0, "ignore_eos": True}
PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def whole(module_launcher: SimPool) -> SimHandle:
    return module_launcher.start(*FAST)


@pytest.fixture(scope="module")
def pd(module_launcher: SimPool) -> PdSim:
    return module_launcher.start_pd(*FAST, decode=("--kv-transfer-ms", "3"))


def events(url: str, path: str, body: dict[str, Any], rid: str) -> list[Any]:
    """A stream's data events, ``created`` dropped (the second it was made in)."""
    out: list[Any] = []
    with (
        httpx.Client(base_url=url, timeout=20) as client,
        client.stream(
            "POST", path, json={**body, "stream": True}, headers={"x-request-id": rid}
        ) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-request-id"] == rid
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    assert out[-1] == "[DONE]"
    for e in out[:-1]:
        e.pop("created", None)
    return out


def answer(url: str, path: str, body: dict[str, Any], rid: str = "r") -> tuple[int, Any]:
    with httpx.Client(base_url=url, timeout=20) as client:
        r = client.post(path, json=body, headers={"x-request-id": rid})
    data = r.json()
    if isinstance(data, dict):
        data.pop("created", None)
    return r.status_code, data


def metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


# --------------------------------------------------------------------------- same answers

STREAMS: list[tuple[str, dict[str, Any]]] = [
    (
        "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 24,
            "logprobs": 3,
            "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **GREEDY,
        },
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_completion_tokens": 20,
            "logprobs": True,
            "top_logprobs": 2,
            "stream_options": {"include_usage": True},
            **GREEDY,
        },
    ),
    # Seeded sampling, a stop string, min_tokens (which the prefill request goes without).
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 40, "temperature": 0.9, "seed": 7}),
    ("/v1/completions", {"prompt": "a b c", "max_tokens": 30, "stop": ["e"], "temperature": 0}),
    ("/v1/completions", {"prompt": "x", "max_tokens": 12, "min_tokens": 12, "temperature": 0}),
]


@pytest.mark.parametrize(("path", "body"), STREAMS)
def test_streams_through_the_router_are_a_whole_sims(
    whole: SimHandle, pd: PdSim, path: str, body: dict[str, Any]
) -> None:
    assert events(pd.url, path, body, "s1") == events(whole.url, path, body, "s1")


def test_whole_answers_and_prompt_logprobs_are_a_whole_sims(whole: SimHandle, pd: PdSim) -> None:
    completion = {"prompt": PROMPT, "max_tokens": 16, "logprobs": 2, "prompt_logprobs": 3}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "logprobs": True}
    for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
        got = answer(pd.url, path, {**body, **GREEDY})
        assert got == answer(whole.url, path, {**body, **GREEDY})
        assert got[0] == 200 and "kv_transfer_params" not in got[1]  # the router's business


def test_concurrent_streams_are_a_whole_sims(whole: SimHandle, pd: PdSim) -> None:
    bodies = [{"prompt": f"{PROMPT} {i}", "max_tokens": 16, **GREEDY} for i in range(12)]

    async def texts(url: str) -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def one(body: dict[str, Any]) -> str:
                parts: list[str] = []
                async with client.stream("POST", "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            parts.append(json.loads(line[6:])["choices"][0]["text"])
                return "".join(parts)

            return await asyncio.gather(*map(one, [{**b, "stream": True} for b in bodies]))

    assert asyncio.run(texts(pd.url)) == asyncio.run(texts(whole.url))


REFUSED: list[tuple[str, Any]] = [
    ("/v1/completions", {"prompt": "x", "model": "other"}),  # 404 from the prefill
    ("/v1/completions", {"prompt": "x", "logprobs": 21}),  # 400 from the prefill
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}),  # 400 from the decode
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}),  # 400 from the decode
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/completions", [1, 2]),  # not an object: straight to the decode
]


@pytest.mark.parametrize(("path", "body"), REFUSED)
def test_refusals_are_a_whole_sims(whole: SimHandle, pd: PdSim, path: str, body: Any) -> None:
    got = answer(pd.url, path, body)
    assert got[0] in (400, 404)
    assert got == answer(whole.url, path, body)


def test_bodies_that_are_not_json_and_unknown_routes_are_a_whole_sims(
    whole: SimHandle, pd: PdSim
) -> None:
    for method, path, content in (
        ("POST", "/v1/completions", b"{not json"),
        ("GET", "/nowhere", b""),
        ("GET", "/v1/completions", b""),
    ):
        a = httpx.request(method, pd.url + path, content=content, timeout=10)
        b = httpx.request(method, whole.url + path, content=content, timeout=10)
        assert (a.status_code, a.json()) == (b.status_code, b.json())
        assert a.headers.get("allow") == b.headers.get("allow")


def test_models_tokenize_and_version_come_from_a_decode_worker(whole: SimHandle, pd: PdSim) -> None:
    with httpx.Client(timeout=10) as c:
        a, b = (c.get(u + "/v1/models").json()["data"][0] for u in (pd.url, whole.url))
        assert (a["id"], a["max_model_len"]) == (b["id"], b["max_model_len"])
        body = {"prompt": PROMPT}
        assert c.post(pd.url + "/tokenize", json=body).json() == (
            c.post(whole.url + "/tokenize", json=body).json()
        )
        assert c.get(pd.url + "/version").json() == c.get(whole.url + "/version").json()
        assert c.get(pd.url + "/health").status_code == 200


def test_every_token_is_the_decode_workers_and_the_prompt_the_prefills(pd: PdSim) -> None:
    (prefill,), (decode,) = pd.prefill, pd.decode
    before = (
        metric(prefill.url, "sim:kv_handoffs_total"),
        metric(decode.url, "sim:kv_transfers_total"),
    )
    status, _ = answer(pd.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, **GREEDY})
    assert status == 200
    after = (
        metric(prefill.url, "sim:kv_handoffs_total"),
        metric(decode.url, "sim:kv_transfers_total"),
    )
    assert after == (before[0] + 1, before[1] + 1)
    assert metric(pd.url, "sim:router_requests_total", 'group="decode"') >= 1


# --------------------------------------------------------------------------- the workers' API


def test_a_prefill_worker_answers_with_the_kv_handoff(pd: PdSim) -> None:
    (prefill,) = pd.prefill
    body = {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    status, data = answer(prefill.url, "/v1/completions", body, rid="h1")
    assert status == 200
    handoff = data["kv_transfer_params"]
    assert handoff["do_remote_prefill"] is True and handoff["do_remote_decode"] is False
    assert handoff["num_prompt_tokens"] == data["usage"]["prompt_tokens"] == 9
    assert handoff["remote_port"] == prefill.port
    assert handoff["remote_request_id"] == "cmpl-h1"
    assert handoff["first_token_ms"] >= 5  # --ttft-ms 5, no jitter
    # The hand-off travels in a JSON answer: a stream asking for one is refused.
    status, data = answer(prefill.url, "/v1/completions", {**body, "stream": True})
    assert status == 400 and data["error"]["param"] == "kv_transfer_params"
    # Without kv_transfer_params a prefill worker is a whole engine, as vLLM's kv_both is.
    status, data = answer(prefill.url, "/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert status == 200 and "kv_transfer_params" not in data


def test_a_decode_worker_checks_the_handoff(pd: PdSim, whole: SimHandle) -> None:
    (decode,) = pd.decode
    body = {"prompt": PROMPT, "max_tokens": 4, **GREEDY}
    for params in (5, "x", [1]):
        status, data = answer(decode.url, "/v1/completions", {**body, "kv_transfer_params": params})
        assert status == 400 and data["error"]["param"] == "kv_transfer_params", data
    held = {"do_remote_prefill": True, "num_prompt_tokens": 3}
    status, data = answer(decode.url, "/v1/completions", {**body, "kv_transfer_params": held})
    assert status == 400 and "3 prompt tokens" in data["error"]["message"]
    # A whole sim does not read the field at all: unchanged from before roles.
    status, _ = answer(whole.url, "/v1/completions", {**body, "kv_transfer_params": 5})
    assert status == 200


# --------------------------------------------------------------------------- timing


def ttft_s(url: str, body: dict[str, Any]) -> float:
    with httpx.Client(base_url=url, timeout=30) as client:
        start = time.monotonic()
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    return time.monotonic() - start
    raise AssertionError("no token")


def test_time_to_first_token_includes_the_prefill_and_the_kv_transfer(launcher: SimPool) -> None:
    flags = ("--load-s", "0", "--warmup-s", "0", "--itl-ms", "1", "--jitter", "0")
    pd = launcher.start_pd(
        *flags,
        prefill=("--ttft-ms", "60"),
        decode=("--ttft-ms", "60", "--kv-transfer-ms", "150", "--kv-transfer-us-per-token", "2000"),
    )
    body = {"prompt": " ".join(["w"] * 50), "max_tokens": 3, **GREEDY}
    # The prefill's TTFT floor (60 ms + 50 us x 50 tokens), then the transfer (150 ms + 2 ms x
    # 50 tokens): at least 312.5 ms; the decode keeps no floor of its own.
    assert ttft_s(pd.url, body) >= 0.060 + 0.0025 + 0.150 + 0.100


# --------------------------------------------------------------------------- faults


def stream_status(url: str, body: dict[str, Any]) -> tuple[int, bytes, httpx.Headers]:
    with (
        httpx.Client(base_url=url, timeout=60) as client,
        client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r,
    ):
        return r.status_code, r.read(), r.headers


def test_a_decode_crash_makes_the_router_answer_errors_promptly(launcher: SimPool) -> None:
    pd = launcher.start_pd(
        *FAST, decode=("--crash-after-requests", "2"), router=("--timeout", "60")
    )
    (decode,) = pd.decode
    body = {"prompt": PROMPT, "max_tokens": 8, **GREEDY}
    for _ in range(2):
        status, content, _ = stream_status(pd.url, body)
        assert status == 200 and content.endswith(b"data: [DONE]\n\n")
    start = time.monotonic()
    status, content, headers = stream_status(pd.url, body)  # the decode dies on this one
    assert time.monotonic() - start < 20  # far below the router's 60 s: it did not wait
    assert status == 502, content
    assert headers["x-sim-worker"] == f"decode {decode.url}"
    error = json.loads(content)["error"]
    assert error["code"] == 502 and f"decode worker {decode.url} broke off" in error["message"]
    assert decode.proc.wait(10) == 1
    # Later requests find the decode worker gone: 502 at once, and the router is not ready.
    status, content, _ = stream_status(pd.url, body)
    assert status == 502 and b"is unreachable" in content
    health = httpx.get(pd.url + "/health", timeout=10)
    assert health.status_code == 503 and f"decode {decode.url}" in health.json()["error"]["message"]
    assert metric(pd.url, "sim:router_failures_total", 'group="decode"') == 2
    assert metric(pd.url, "sim:router_failures_total", 'group="prefill"') == 0


def cut_stream(url: str, body: dict[str, Any]) -> tuple[int, list[str], httpx.TransportError]:
    """A stream that must break off: its status, the lines that came, how it broke."""
    lines: list[str] = []
    with httpx.stream(
        "POST", url + "/v1/completions", json={**body, "stream": True}, timeout=30
    ) as r:
        try:
            lines.extend(r.iter_lines())
        except httpx.TransportError as exc:
            return r.status_code, lines, exc
    raise AssertionError(f"the stream ended whole: {lines[-3:]}")


def test_a_decode_crash_mid_stream_cuts_the_clients_stream(launcher: SimPool) -> None:
    pd = launcher.start_pd(*FAST, decode=("--itl-ms", "20"))
    (decode,) = pd.decode
    body = {"prompt": PROMPT, "max_tokens": 4000, "stream": True, **GREEDY}
    lines: list[str] = []
    with httpx.stream("POST", pd.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        it = r.iter_lines()
        lines.append(next(line for line in it if line.startswith("data: {")))
        decode.kill()  # SIGKILL: a crash, with tokens already out
        with pytest.raises(httpx.RemoteProtocolError):
            lines.extend(it)
    # A truncated stream, never one that looks complete: as when a whole sim crashes.
    assert "data: [DONE]" not in lines


def test_a_silent_decode_fails_within_the_routers_timeout(launcher: SimPool) -> None:
    pd = launcher.start_pd(*FAST, decode=("--hang-after-tokens", "2"), router=("--timeout", "1"))
    start = time.monotonic()
    status, lines, _ = cut_stream(pd.url, {"prompt": PROMPT, "max_tokens": 50, **GREEDY})
    assert 1.0 <= time.monotonic() - start < 20
    assert status == 200 and sum(line.startswith("data: {") for line in lines) == 2
    # Slow is not a crash: the worker is up, and a request it does not stall is answered.
    status, data = answer(pd.url, "/v1/completions", {"prompt": "x", "max_tokens": 1, **GREEDY})
    assert status == 200 and data["usage"]["completion_tokens"] == 1


def test_a_workers_own_error_answers_go_through_unchanged(launcher: SimPool) -> None:
    pd = launcher.start_pd(*FAST, decode=("--error-rate", "1"))
    (decode,) = pd.decode
    status, content, headers = stream_status(pd.url, {"prompt": "x", "max_tokens": 3})
    assert status == 500
    assert json.loads(content)["error"]["message"] == "Simulated engine failure (--error-rate)"
    assert headers["x-sim-worker"] == f"decode {decode.url}"


def test_a_dead_prefill_worker_is_named(launcher: SimPool) -> None:
    pd = launcher.start_pd(*FAST)
    (prefill,) = pd.prefill
    prefill.kill()
    status, data = answer(pd.url, "/v1/completions", {"prompt": "x", "max_tokens": 3})
    assert status == 502
    assert f"prefill worker {prefill.url} is unreachable" in data["error"]["message"]


# --------------------------------------------------------------------------- readiness


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_router_is_ready_only_once_both_groups_are(launcher: SimPool) -> None:
    prefill = launcher.start(*FAST, "--role", "prefill")
    # Nothing listens on the decode's port yet, then it warms up for 2 s.
    port = free_port()
    decode_url = f"http://127.0.0.1:{port}"
    router = launcher.start(
        "--prefill", prefill.url, "--decode", decode_url, ready=False, module=ROUTER_MODULE
    )
    health = httpx.get(router.url + "/health", timeout=10)
    assert health.status_code == 503 and f"decode {decode_url}: ConnectError" in health.text
    started = time.monotonic()
    launcher.start(*FAST, "--role", "decode", "--warmup-s", "2", port=port, ready=False)
    assert health_status(router.url) == 503
    phases = PhaseLog("candidate", Clock())
    asyncio.run(
        wait_ready(
            role="candidate",
            base_url=router.url,
            model="demo-model",
            phases=phases,
            order=ENDPOINT_PHASES,
            timeout_s=30,
        )
    )
    assert time.monotonic() - started >= 2.0  # not before the decode worker was warm
    assert {"port_open", "healthy", "model_listed"} <= set(phases.reached)


# --------------------------------------------------------------------------- teardown


def test_sigterm_stops_the_router_mid_stream_and_teardown_leaves_no_process(
    tmp_path: Path, tag: str, find_processes: Callable[[str], list[int]]
) -> None:
    with SimPool(workdir=tmp_path, cwd=REPO_ROOT) as pool:
        pd = pool.start_pd(*FAST, "--tag", tag, decode=("--itl-ms", "20"), router=("--tag", tag))
        assert len(find_processes(tag)) == 3
        body = {"prompt": PROMPT, "max_tokens": 4000, "stream": True, **GREEDY}
        with httpx.stream("POST", pd.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            pd.router.proc.send_signal(signal.SIGTERM)
            assert pd.router.proc.wait(10) == 0  # a clean exit, stream in flight or not
        assert len(find_processes(tag)) == 2
    assert find_processes(tag) == []  # and the `tag` fixture checks again


def test_a_router_without_workers_answers_at_once(launcher: SimPool) -> None:
    prefill, decode = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    router = launcher.start(
        "--prefill", prefill, "--decode", decode, ready=False, module=ROUTER_MODULE
    )
    start = time.monotonic()
    assert health_status(router.url) == 503
    status, data = answer(router.url, "/v1/completions", {"prompt": "x"})
    assert status == 502 and f"prefill worker {prefill} is unreachable" in data["error"]["message"]
    models = httpx.get(router.url + "/v1/models", timeout=10)
    assert models.status_code == 502 and f"decode worker {decode}" in models.text
    assert time.monotonic() - start < 15  # refused connections, not timeouts


# --------------------------------------------------------------------------- pure parts


def test_the_prefill_request_is_vllms_toy_proxys() -> None:
    client = {
        "prompt": "x", "max_tokens": 50, "max_completion_tokens": 50, "stream": True,
        "stream_options": {"include_usage": True}, "min_tokens": 3, "prompt_logprobs": 2,
        "logprobs": 1, "temperature": 0,
    }  # fmt: skip
    assert json.loads(prefill_body(client)) == {
        "prompt": "x", "max_tokens": 1, "max_completion_tokens": 1, "stream": False,
        "logprobs": 1, "temperature": 0,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }  # fmt: skip
    assert client["max_tokens"] == 50  # the decode gets the client's own request


def test_router_flags() -> None:
    flags = (
        "--port 0 --prefill http://a:1 --prefill http://b:2/ --decode http://c:3 "
        "--timeout 9 --connect-timeout 1.5 --health-timeout 0.5"
    )
    config = parse_args(flags.split())
    assert config == RouterConfig(
        port=0, prefill=("http://a:1", "http://b:2"), decode=("http://c:3",),
        timeout_s=9, connect_timeout_s=1.5, health_timeout_s=0.5,
    )  # fmt: skip
    for argv in (
        "--port 0 --prefill http://a:1",  # no decode group
        "--port 0 --decode http://a:1",  # no prefill group
        "--port 0 --prefill a:1 --decode http://c:3",
        "--port 0 --prefill http://a --decode http://c:3",  # no port
        "--port 0 --prefill http://a:1/v1 --decode http://c:3",
        "--port 0 --prefill http://a:1 --decode http://c:3 --timeout 0",
        "--port 70000 --prefill http://a:1 --decode http://c:3",
    ):
        with pytest.raises(SystemExit) as info:
            parse_args(argv.split())
        assert info.value.code == 2, argv
