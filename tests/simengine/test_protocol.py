"""Request validation and response encoding, without sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from simengine.engine import Decoder, StreamEvent
from simengine.model import ToyModel, ToyTokenizer
from simengine.protocol import (
    ApiError,
    ApiRequest,
    StreamEncoder,
    full_response,
    parse_chat_request,
    parse_completion_request,
    parse_tokenize_request,
    prompt_logprobs_json,
    stream_error_event,
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


def _events(req: ApiRequest) -> list[StreamEvent]:
    decoder = Decoder(MODEL, TOKENIZER, req.generation)
    out = []
    while not decoder.finished:
        out.append(decoder.step(2))
    return out


def _sse(raw: bytes) -> dict[str, Any]:
    text = raw.decode()
    assert text.startswith("data: ")
    assert text.endswith("\n\n")
    parsed: dict[str, Any] = json.loads(text[len("data: ") :])
    return parsed


def test_stream_encoder_templates_produce_valid_chunks() -> None:
    req = completion(
        prompt="x y",
        max_tokens=3,
        temperature=0,
        stream=True,
        logprobs=1,
        return_token_ids=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        stop=["never"],
    )
    enc = StreamEncoder(req, request_id='cmpl-"q"', model="m\u00e9", tokenizer=TOKENIZER, created=7)
    chunks = [_sse(enc.event(ev)) for ev in _events(req)]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [2, 3]
    assert chunks[0]["id"] == 'cmpl-"q"'
    assert chunks[0]["model"] == "m\u00e9"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert [len(c["choices"][0]["token_ids"]) for c in chunks] == [2, 1]
    assert chunks[1]["choices"][0]["logprobs"]["text_offset"][0] == len(
        chunks[0]["choices"][0]["text"]
    )
    final = _sse(enc.usage_event(3))
    assert final["choices"] == []
    assert final["usage"]["total_tokens"] == 5


def test_full_response_merges_events() -> None:
    req = chat(max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    events = _events(req)
    body = json.loads(
        full_response(req, events, request_id="chatcmpl-1", model="m", tokenizer=TOKENIZER)
    )
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"]["content"] == "".join(e.text for e in events)
    assert len(choice["logprobs"]["content"]) == 4
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_prompt_logprobs_json_puts_the_actual_token_first() -> None:
    prompt = TOKENIZER.encode("a b c d")
    scores = MODEL.prompt_logprobs(prompt, 2)
    out = prompt_logprobs_json(scores, TOKENIZER)
    assert out[0] is None
    assert len(out) == len(prompt)
    for token_id, entry, score in zip(prompt[1:], out[1:], scores, strict=True):
        assert entry is not None
        first_key, first = next(iter(entry.items()))
        assert first_key == str(token_id)
        assert first["rank"] == score.rank
        assert first["decoded_token"] == TOKENIZER.token_str(token_id)
        ranks = {v["rank"] for k, v in entry.items() if k != first_key}
        assert ranks <= {1, 2}
    req = completion(max_tokens=1, temperature=0, prompt_logprobs=2)
    assert req.prompt_logprobs == 2
    body = json.loads(
        full_response(
            req, _events(req), request_id="x", model="m", tokenizer=TOKENIZER, prompt_scores=[]
        )
    )
    assert body["choices"][0]["prompt_logprobs"] == [None]


def test_nan_logprobs_render_as_null_and_errors_as_vllm_does() -> None:
    req = completion(max_tokens=2, temperature=0, logprobs=1, stream=True)
    enc = StreamEncoder(req, request_id="c", model="m", tokenizer=TOKENIZER, nan_logprobs=True)
    chunk = _sse(enc.event(_events(req)[0]))
    lps = chunk["choices"][0]["logprobs"]
    assert lps["token_logprobs"] == [None, None]
    assert all(v is None for top in lps["top_logprobs"] for v in top.values())
    error = _sse(stream_error_event("boom"))
    assert error == {
        "error": {"message": "boom", "type": "BadRequestError", "param": None, "code": 400}
    }
