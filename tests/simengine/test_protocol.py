"""Request validation as vLLM does it, without sockets (the answers: test_responses.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from simengine.model import ToyModel, ToyTokenizer
from simengine.protocol import (
    ApiError,
    ApiRequest,
    parse_chat_request,
    parse_completion_request,
    parse_tokenize_request,
)

TOKENIZER = ToyTokenizer(4096)
MODEL = ToyModel(4096)


def completion(**fields: Any) -> ApiRequest:
    body = {"model": "m", "prompt": "a b c", **fields}
    return parse_completion_request(json.dumps(body).encode(), TOKENIZER, "m", 64)


def chat(**fields: Any) -> ApiRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "a b"}], **fields}
    return parse_chat_request(json.dumps(body).encode(), TOKENIZER, "m", 64)


def error_of(fn: Any, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(**fields)
    return info.value


def test_defaults_follow_vllm() -> None:
    req = completion()
    assert req.generation.max_tokens == 16
    assert req.generation.temperature == 1.0
    assert req.generation.prompt_token_ids == tuple(TOKENIZER.encode("a b c"))
    # Chat defaults to the rest of the context window.
    assert chat().generation.max_tokens == 64 - 4
    assert chat(max_completion_tokens=5).generation.max_tokens == 5


def test_prompt_forms() -> None:
    assert completion(prompt=[5, 6]).generation.prompt_token_ids == (5, 6)
    assert completion(prompt=["x y"]).generation.prompt_token_ids == tuple(TOKENIZER.encode("x y"))
    assert completion(prompt=[[7]]).generation.prompt_token_ids == (7,)


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({"model": "other"}, 404, "model"),
        ({"prompt": None}, 400, "prompt"),
        ({"prompt": 3}, 400, "prompt"),
        ({"prompt": ["a", "b"]}, 400, "prompt"),
        ({"prompt": [5000]}, 400, "prompt"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": "7"}, 400, "max_tokens"),
        ({"max_tokens": True}, 400, "max_tokens"),
        ({"max_tokens": 62}, 400, "max_tokens"),
        ({"temperature": -1}, 400, "temperature"),
        ({"n": 2}, 400, "n"),
        ({"stop": 5}, 400, "stop"),
        ({"logprobs": 21}, 400, "logprobs"),
        ({"stream_options": {"include_usage": True}}, 400, "stream_options"),
        ({"echo": True}, 400, "echo"),
    ],
)
def test_completion_errors(fields: dict[str, Any], status: int, param: str) -> None:
    err = error_of(completion, **fields)
    assert (err.status, err.param) == (status, param)
    body = json.loads(err.body())["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["code"] == status
    assert body["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_body_must_be_a_json_object() -> None:
    for raw in (b"{nope", b"[1, 2]", b"\xff"):
        with pytest.raises(ApiError) as info:
            parse_completion_request(raw, TOKENIZER, "m", 64)
        assert info.value.status == 400


def test_chat_errors() -> None:
    assert error_of(chat, messages=[]).param == "messages"
    assert error_of(chat, messages=[{"content": "x"}]).param == "messages"
    assert error_of(chat, top_logprobs=2).param == "top_logprobs"
    assert chat(logprobs=True).generation.logprobs == 0
    assert chat(logprobs=True, top_logprobs=3).generation.logprobs == 3
    assert chat().generation.logprobs is None


def test_continuous_usage_needs_include_usage_as_in_vllm() -> None:
    only = completion(stream=True, stream_options={"continuous_usage_stats": True})
    assert not only.stream_options.continuous_usage
    both = completion(
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}
    )
    assert both.stream_options.include_usage
    assert both.stream_options.continuous_usage


def test_tokenize_accepts_prompt_or_messages() -> None:
    assert parse_tokenize_request(b'{"prompt": "a b"}', TOKENIZER, "m") == TOKENIZER.encode("a b")
    ids = parse_tokenize_request(
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}',
        TOKENIZER,
        "m",
    )
    assert len(ids) == 3
    with pytest.raises(ApiError):
        parse_tokenize_request(b"{}", TOKENIZER, "m")
