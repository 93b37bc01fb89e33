"""The logprobs reader, fed with engines' exact bytes.

- llama.cpp's ``llama-server`` (``../shared/captures/``, captured with ``curl -i -N``; see
  that folder's README): the chat-style ``content`` list on ``/v1/completions``, each entry
  with its token ``id`` and ``top_logprobs`` as a list.
- vLLM's completions form (vllm/entrypoints/openai/protocol.py, ``CompletionLogProbs``:
  ``text_offset``, ``token_logprobs``, ``tokens``, ``top_logprobs`` as a list of dicts).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from loadgen.logprobs import concatenate, parse_logprobs

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "captures"


def _body(name: str) -> bytes:
    raw = (CAPTURES / name).read_bytes()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not body:
        head, _, body = raw.partition(b"\n\n")
    assert head.startswith(b"HTTP/1.1 200"), name
    return body


def _events(body: bytes) -> list[dict[str, object]]:
    out = []
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[len("data: ") :]))
    return out


def test_llamacpp_completions_content_list_with_ids() -> None:
    doc = json.loads(_body("llamacpp-completions-logprobs.http"))
    choice = doc["choices"][0]
    got = parse_logprobs(choice["logprobs"])
    assert got is not None and got.shape == "content"
    assert got.tokens == [" are", " prob", " 10"]
    assert "".join(got.tokens) == choice["text"]
    assert got.ids == [733, 457, 336]
    assert got.logprobs[0] == pytest.approx(-1.3172481060028076)
    assert got.top[0][" afternoon"] == pytest.approx(-1.8763397932052612)
    assert all(len(t) == 3 for t in got.top)
    # the sampled token is its own top-1 under greedy decoding
    assert all(max(t, key=t.__getitem__) == tok for t, tok in zip(got.top, got.tokens, strict=True))
    # every top entry names its id: the top-k keyed by id, the sampled id its top-1
    assert got.top_ids is not None and [len(t) for t in got.top_ids] == [3, 3, 3]
    assert all(max(t, key=t.__getitem__) == i for t, i in zip(got.top_ids, got.ids, strict=True))


def test_llamacpp_stream_chunks_concatenate() -> None:
    chunks = _events(_body("llamacpp-completions-stream-logprobs.http"))
    parts = [
        p
        for c in chunks
        for ch in c.get("choices", [])  # type: ignore[attr-defined]
        if (p := parse_logprobs(ch.get("logprobs"))) is not None
    ]
    whole = concatenate(parts)
    assert whole is not None and whole.ids is not None
    text = "".join(ch.get("text", "") for c in chunks for ch in c.get("choices", []))  # type: ignore[attr-defined]
    assert "".join(whole.tokens) == text
    assert len(whole.ids) == len(whole.tokens) == len(whole.logprobs) == len(whole.top)


def test_llamacpp_chat_stream_role_chunk_has_none() -> None:
    chunks = _events(_body("llamacpp-chat-stream-logprobs.http"))
    first = chunks[0]["choices"][0]  # type: ignore[index]
    assert parse_logprobs(first.get("logprobs")) is None  # the role chunk: content null
    parts = [
        p
        for c in chunks[1:]
        for ch in c.get("choices", [])  # type: ignore[attr-defined]
        if (p := parse_logprobs(ch.get("logprobs"))) is not None
    ]
    assert parts and all(p.ids is not None for p in parts)


def test_llamacpp_ignores_prompt_logprobs() -> None:
    doc = json.loads(_body("llamacpp-completions-prompt-logprobs.http"))
    assert parse_logprobs(doc["choices"][0]["logprobs"]) is None


def test_vllm_completions_lists_and_null_is_nan() -> None:
    lp = {
        "text_offset": [0, 4],
        "token_logprobs": [-0.25, None],
        "tokens": [" The", " cat"],
        "top_logprobs": [{" The": -0.25, " A": -1.5}, {" cat": -0.1}],
    }
    got = parse_logprobs(lp)
    assert got is not None and got.shape == "completions" and got.ids is None
    assert got.tokens == [" The", " cat"] and got.top[0] == {" The": -0.25, " A": -1.5}
    assert got.logprobs[0] == -0.25 and math.isnan(got.logprobs[1])
    assert got.top_ids is None  # keyed by text: a vLLM run is compared by text


def test_top_logprobs_as_dict_inside_content_and_partial_ids() -> None:
    lp = {
        "content": [
            {"token": "a", "logprob": -0.5, "top_logprobs": {"a": -0.5, "b": -2.0}},
            {"token": "b", "logprob": -0.1, "id": 7, "top_logprobs": []},
        ]
    }
    got = parse_logprobs(lp)
    assert got is not None and got.top[0] == {"a": -0.5, "b": -2.0} and got.top[1] == {}
    assert got.ids is None  # one entry without an id: none are trusted


@pytest.mark.parametrize("lp", [None, [], "x", {}, {"content": None}, {"tokens": ["a"]}])
def test_neither_shape_is_none(lp: object) -> None:
    assert parse_logprobs(lp) is None
