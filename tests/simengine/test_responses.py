"""The sim's answers in vLLM's wire format (simengine/responses.py), without sockets."""

from __future__ import annotations

import json
from typing import Any

from simengine.engine import Decoder, StreamEvent
from simengine.model import ToyModel, ToyTokenizer
from simengine.protocol import ApiRequest, Endpoint, parse_generation_request
from simengine.responses import (
    StreamEncoder,
    full_response,
    prompt_logprobs_json,
    stream_error_event,
)

TOKENIZER = ToyTokenizer(4096)
MODEL = ToyModel(4096)
PROMPTS: dict[Endpoint, dict[str, Any]] = {
    "completion": {"prompt": "a b c"},
    "chat": {"messages": [{"role": "user", "content": "a b"}]},
}


def request(endpoint: Endpoint, **fields: Any) -> ApiRequest:
    body = {"model": "m", **PROMPTS[endpoint], **fields}
    return parse_generation_request(endpoint, json.dumps(body).encode(), TOKENIZER, "m", 64)


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
    req = request(
        "completion",
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
    req = request("chat", max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
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
    req = request("completion", max_tokens=1, temperature=0, prompt_logprobs=2)
    assert req.prompt_logprobs == 2
    body = json.loads(
        full_response(
            req, _events(req), request_id="x", model="m", tokenizer=TOKENIZER, prompt_scores=[]
        )
    )
    assert body["choices"][0]["prompt_logprobs"] == [None]


def test_nan_logprobs_render_as_null_and_errors_as_vllm_does() -> None:
    req = request("completion", max_tokens=2, temperature=0, logprobs=1, stream=True)
    enc = StreamEncoder(req, request_id="c", model="m", tokenizer=TOKENIZER, nan_logprobs=True)
    chunk = _sse(enc.event(_events(req)[0]))
    lps = chunk["choices"][0]["logprobs"]
    assert lps["token_logprobs"] == [None, None]
    assert all(v is None for top in lps["top_logprobs"] for v in top.values())
    error = _sse(stream_error_event("boom"))
    assert error == {
        "error": {"message": "boom", "type": "BadRequestError", "param": None, "code": 400}
    }
