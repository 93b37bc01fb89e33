"""The sim as clients see it: real processes, real sockets, vLLM's wire format."""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from simengine.launch import SimHandle, SimPool

# Fast timing for wire-format tests: they check content, not latency.
FAST_FLAGS = (
    "--load-s",
    "0",
    "--warmup-s",
    "0",
    "--ttft-ms",
    "5",
    "--itl-ms",
    "1",
    "--jitter",
    "0",
)
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def sim(module_launcher: SimPool) -> SimHandle:
    """One fast sim shared by the wire-format tests of this module."""
    return module_launcher.start(*FAST_FLAGS)


@pytest.fixture
def client(sim: SimHandle) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=10.0) as c:
        yield c


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    """POST with stream=true; returns parsed data events, with "[DONE]" kept as a string."""
    events: list[Any] = []
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["transfer-encoding"] == "chunked"
        for line in resp.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def chunks_of(events: list[Any]) -> list[dict[str, Any]]:
    assert events[-1] == "[DONE]"
    assert "[DONE]" not in events[:-1]
    return [e for e in events[:-1]]


def completion_text(client: httpx.Client, prompt: str, n: int = 24) -> str:
    body = {"prompt": prompt, "max_tokens": n, **GREEDY}
    text: str = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    return text


# --------------------------------------------------------------------------- basics


def test_health_models_version(client: httpx.Client) -> None:
    health = client.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == "demo-model"
    assert card["object"] == "model"
    assert card["owned_by"] == "sim"
    assert card["max_model_len"] == 4096
    assert isinstance(card["created"], int)
    assert "version" in client.get("/version").json()


def test_completion_stream_wire_format(client: httpx.Client) -> None:
    events = stream(
        client,
        "/v1/completions",
        {"model": "demo-model", "prompt": "tell me a story", "max_tokens": 5, **GREEDY},
    )
    chunks = chunks_of(events)
    assert len(chunks) == 5
    first = chunks[0]
    assert first["id"].startswith("cmpl-")
    assert len(first["id"]) > len("cmpl-") + 16
    for chunk in chunks:
        assert set(chunk) == {"id", "object", "created", "model", "choices"}
        assert (chunk["id"], chunk["created"]) == (first["id"], first["created"])
        assert chunk["object"] == "text_completion"
        assert chunk["model"] == "demo-model"
        (choice,) = chunk["choices"]
        assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}
        assert choice["index"] == 0
        assert choice["logprobs"] is None
        assert choice["text"].startswith(" ")
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    assert all(c["choices"][0]["stop_reason"] is None for c in chunks)


def test_completion_non_stream_matches_stream(client: httpx.Client) -> None:
    body = {"prompt": "tell me a story", "max_tokens": 7, **GREEDY}
    resp = client.post("/v1/completions", json=body)
    assert resp.headers["content-type"] == "application/json"
    data = resp.json()
    assert data["object"] == "text_completion"
    assert data["id"].startswith("cmpl-")
    (choice,) = data["choices"]
    assert choice["finish_reason"] == "length"
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
    streamed = "".join(
        c["choices"][0]["text"] for c in chunks_of(stream(client, "/v1/completions", body))
    )
    assert streamed == choice["text"]
    assert len(choice["text"].split()) == 7


def test_chat_stream_wire_format(client: httpx.Client) -> None:
    body = {
        "model": "demo-model",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        **GREEDY,
    }
    chunks = chunks_of(stream(client, "/v1/chat/completions", body))
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    content = chunks[1:]
    assert len(content) == 4
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"] == chunks[0]["id"]
    for chunk in content:
        (choice,) = chunk["choices"]
        assert set(choice["delta"]) == {"content"}
    assert content[-1]["choices"][0]["finish_reason"] == "length"

    full = client.post("/v1/chat/completions", json=body).json()
    assert full["object"] == "chat.completion"
    message = full["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] == "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert full["usage"]["prompt_tokens"] == 4  # <|user|> hello there <|assistant|>


def test_usage_chunk_and_continuous_usage(client: httpx.Client) -> None:
    base = {"prompt": "a b c", "max_tokens": 6, **GREEDY}
    chunks = chunks_of(
        stream(client, "/v1/completions", {**base, "stream_options": {"include_usage": True}})
    )
    *tokens, final = chunks
    assert final["choices"] == []
    assert final["usage"] == {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}
    assert all("usage" not in c for c in tokens)

    continuous = chunks_of(
        stream(
            client,
            "/v1/completions",
            {
                **base,
                "return_token_ids": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
    )
    *tokens, final = continuous
    counts = [c["usage"]["completion_tokens"] for c in tokens]
    sizes = [len(c["choices"][0]["token_ids"]) for c in tokens]
    assert counts == [sum(sizes[: i + 1]) for i in range(len(sizes))]
    assert final["usage"]["completion_tokens"] == counts[-1] == 6

    chat = chunks_of(
        stream(
            client,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 2,
                **GREEDY,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
    )
    assert chat[0]["usage"]["completion_tokens"] == 0  # the role chunk carries no token
    assert chat[-1]["choices"] == []
    assert chat[-1]["usage"]["completion_tokens"] == 2


def test_token_ids_match_tokenize(client: httpx.Client) -> None:
    chunks = chunks_of(
        stream(
            client,
            "/v1/completions",
            {"prompt": "x", "max_tokens": 5, "return_token_ids": True, **GREEDY},
        )
    )
    assert chunks[0]["choices"][0]["prompt_token_ids"] == _ids_of_client(client, "x")
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokenized = client.post("/tokenize", json={"prompt": text}).json()
    assert tokenized == {"count": 5, "max_model_len": 4096, "tokens": ids}
    assert client.post("/detokenize", json={"tokens": ids}).json() == {"prompt": text}


def _ids_of_client(client: httpx.Client, text: str) -> list[int]:
    ids: list[int] = client.post("/tokenize", json={"prompt": text}).json()["tokens"]
    return ids


def test_chat_return_token_ids(client: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {"messages": messages, "max_tokens": 2, "return_token_ids": True, **GREEDY}
    chunks = chunks_of(stream(client, "/v1/chat/completions", body))
    prompt_ids = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    assert [len(c["choices"][0]["token_ids"]) for c in chunks[1:]] == [1, 1]
    full = client.post("/v1/chat/completions", json=body).json()
    assert full["prompt_token_ids"] == prompt_ids
    assert full["choices"][0]["token_ids"] == [c["choices"][0]["token_ids"][0] for c in chunks[1:]]


def test_completion_logprobs_are_log_softmax(client: httpx.Client) -> None:
    body = {"prompt": "a b c", "max_tokens": 4, "logprobs": 3, "return_token_ids": True}
    chunks = chunks_of(stream(client, "/v1/completions", {**body, **GREEDY}))
    offset = 0
    for chunk in chunks:
        choice = chunk["choices"][0]
        lp = choice["logprobs"]
        assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
        assert len(lp["tokens"]) == len(choice["token_ids"]) == 1
        assert lp["tokens"][0] == choice["text"]
        assert lp["text_offset"] == [offset]
        offset += len(choice["text"])
        (top,) = lp["top_logprobs"]
        assert len(top) == 3
        assert sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-9
        assert all(v <= 0 for v in top.values())
        # Greedy: the chosen token is the most likely one.
        assert max(top, key=top.__getitem__) == lp["tokens"][0]
        assert top[lp["tokens"][0]] == lp["token_logprobs"][0]

    full = client.post("/v1/completions", json={**body, **GREEDY}).json()
    merged = full["choices"][0]["logprobs"]
    assert len(merged["tokens"]) == 4
    assert merged["text_offset"][0] == 0


def test_chat_logprobs_shape(client: httpx.Client) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "logprobs": True,
        "top_logprobs": 2,
        **GREEDY,
    }
    chunks = chunks_of(stream(client, "/v1/chat/completions", body))
    for chunk in chunks[1:]:
        (entry,) = chunk["choices"][0]["logprobs"]["content"]
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["token"] == chunk["choices"][0]["delta"]["content"]
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
        assert sum(math.exp(t["logprob"]) for t in entry["top_logprobs"]) <= 1.0 + 1e-9


def test_stop_string(client: httpx.Client) -> None:
    text = completion_text(client, "go on then", 10)
    word = text.split()[3]
    resp = client.post(
        "/v1/completions",
        json={"prompt": "go on then", "max_tokens": 10, "stop": [word], **GREEDY},
    ).json()
    choice = resp["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", word)
    assert choice["text"] == text[: text.index(word)]


def test_sampling_with_seed_is_reproducible(client: httpx.Client) -> None:
    body = {"prompt": "p q", "max_tokens": 12, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    a = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    b = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert a == b
    assert a != completion_text(client, "p q", 12)


# --------------------------------------------------------------------------- errors


def test_error_bodies(client: httpx.Client) -> None:
    resp = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }
    cases = [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", json.dumps({"max_tokens": 3}).encode(), "prompt"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -1}).encode(), "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "a"}).encode(), "max_tokens"),
        ("/v1/completions", json.dumps({"prompt": "x", "n": 2}).encode(), "n"),
        ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), "messages"),
    ]
    for path, raw, param in cases:
        resp = client.post(path, content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 400, raw
        error = resp.json()["error"]
        assert error["type"] == "BadRequestError"
        assert error["code"] == 400
        assert error["param"] == param
        assert error["message"]

    missing = client.get("/v2/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NotFoundError"
    wrong_method = client.get("/v1/completions")
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"


def test_bodies_over_one_mib_are_rejected(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as client:
        resp = client.post("/v1/completions", content=b"x" * ((1 << 20) + 1))
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == 413


def test_openai_client_streams_without_errors(sim: SimHandle) -> None:
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    extra = {"ignore_eos": True, "return_token_ids": True}
    pieces = []
    for chunk in client.completions.create(
        model="demo-model",
        prompt="hello world",
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    ):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
        else:
            assert chunk.usage is not None
            assert chunk.usage.completion_tokens == 5
    assert len(pieces) == 5

    deltas = []
    for cchunk in client.chat.completions.create(
        model="demo-model",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=4,
        temperature=0,
        stream=True,
        logprobs=True,
        top_logprobs=2,
        extra_body=extra,
    ):
        deltas.append(cchunk.choices[0].delta.content)
    assert deltas[0] == ""
    assert len(deltas) == 5

    resp = client.chat.completions.create(
        model="demo-model",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=4,
        temperature=0,
        extra_body=extra,
    )
    assert resp.choices[0].message.content == "".join(d or "" for d in deltas)
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 4

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=1)


# --------------------------------------------------------------------------- raw HTTP/1.1


def _raw_exchange(sim: SimHandle, payload: bytes, *, until_close: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(payload)
        if not until_close:
            sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def test_pipelined_keep_alive_requests_then_connection_close(sim: SimHandle) -> None:
    body = json.dumps({"prompt": "a", "max_tokens": 2, **GREEDY}).encode()
    payload = (
        _post("/v1/completions", body)
        + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
        + _post("/tokenize", b'{"prompt": "a b"}', "connection: close\r\n")
    )
    data = _raw_exchange(sim, payload)
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 3
    last_body = data.rsplit(b"\r\n\r\n", 1)[1]
    assert json.loads(last_body)["tokens"] == _ids_of(sim, "a b")
    assert b"connection: close" in data.lower()


def _ids_of(sim: SimHandle, text: str) -> list[int]:
    ids: list[int] = httpx.post(sim.url + "/tokenize", json={"prompt": text}).json()["tokens"]
    return ids


def test_chunked_request_body_and_expect_continue(sim: SimHandle) -> None:
    body = b'{"prompt": "a b c"}'
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (5, body[:5], len(body) - 5, body[5:])
    head = (
        b"POST /tokenize HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
        b"connection: close\r\n\r\n"
    )
    data = _raw_exchange(sim, head + chunked)
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert b'"count":3' in data

    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(
            _post("/tokenize", body, "expect: 100-continue\r\nconnection: close\r\n")[: -len(body)]
        )
        assert sock.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
    assert rest.startswith(b"HTTP/1.1 200 OK")
    assert b'"count":3' in rest


def test_http10_stream_is_delimited_by_close(sim: SimHandle) -> None:
    body = json.dumps({"prompt": "a", "max_tokens": 2, "stream": True, **GREEDY}).encode()
    payload = (
        f"POST /v1/completions HTTP/1.0\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body
    )
    data = _raw_exchange(sim, payload)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower()
    assert rest.endswith(b"data: [DONE]\n\n")
    assert rest.count(b"data: {") == 2


def test_malformed_request_gets_400_and_close(sim: SimHandle) -> None:
    data = _raw_exchange(sim, b"NOT A REQUEST\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400")


# --------------------------------------------------------------------------- metrics


def _metric(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


def test_metrics_track_running_and_finished(client: httpx.Client) -> None:
    text = client.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    assert "# TYPE vllm:num_requests_running gauge" in text.text
    assert 'vllm:num_requests_waiting{model_name="demo-model"} 0.0' in text.text
    length_done = 'vllm:request_success_total{finished_reason="length",model_name="demo-model"}'
    aborted = 'vllm:request_success_total{finished_reason="abort",model_name="demo-model"}'
    before_len, before_abort = _metric(client, length_done), _metric(client, aborted)

    assert _metric(client, "vllm:num_requests_running") == 0.0
    body = {"prompt": "a", "max_tokens": 2000, "stream": True, **GREEDY}
    with client.stream("POST", "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        with httpx.Client(base_url=str(client.base_url)) as other:
            assert _metric(other, "vllm:num_requests_running") == 1.0
    # Leaving the block closed the connection mid-stream: the request is aborted.
    deadline = time.monotonic() + 5
    while _metric(client, aborted) == before_abort and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _metric(client, aborted) == before_abort + 1
    assert _metric(client, "vllm:num_requests_running") == 0.0
    client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, **GREEDY})
    assert _metric(client, length_done) == before_len + 1
    assert _metric(client, "vllm:generation_tokens_total") > 0
