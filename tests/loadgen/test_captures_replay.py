"""The load generator's streaming client against a real engine's exact responses: a socket server
replays llama.cpp's captured bytes (``tests/support/capture_replay.py``) and the client reads
them as it would the engine.
"""

from __future__ import annotations

import asyncio
import json
import time

from capture_replay import CAPTURES, replay, split_capture

from loadgen.client import RequestSpec, Target, make_client, send_request
from loadgen.records import RequestRecord


def fetch(name: str, api: str = "completions") -> RequestRecord:
    async def main() -> RequestRecord:
        async with replay(name) as url:
            target = Target("llamacpp", url, api=api, timeout_s=5.0)  # type: ignore[arg-type]
            spec = RequestSpec(0, "hello", 8, {"logprobs": 3})
            async with make_client(target, 1) as client:
                return await send_request(client, target, spec, time.monotonic_ns())

    return asyncio.run(main())


def expected(name: str, api: str) -> tuple[str, list[int], list[float]]:
    """What the capture's events say, read here independently of the client: the text, and
    each content entry's id and logprob."""
    _, body = split_capture((CAPTURES / name).read_bytes())
    text, ids, lps = "", [], []
    for line in body.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            piece = choice.get("text") if api == "completions" else choice["delta"].get("content")
            text += piece or ""
            for entry in (choice.get("logprobs") or {}).get("content") or []:
                ids.append(entry["id"])
                lps.append(entry["logprob"])
    return text, ids, lps


def test_completions_stream_with_the_chat_style_logprob_list() -> None:
    name = "llamacpp-completions-stream-logprobs.http"
    rec = fetch(name)
    text, ids, lps = expected(name, "completions")
    assert rec.error_kind is None, rec.error_message
    assert rec.status == 200 and rec.finish_reason == "length"
    # llama.cpp sends no `token_ids`: the ids are the logprob entries' own
    assert rec.text == text and rec.token_ids == ids and rec.logprobs == lps
    assert rec.output_tokens == len(ids) == 4 and rec.prompt_tokens == 5  # its usage
    assert rec.chunk_tokens == [1, 1, 1, 1]


def test_chat_stream_role_chunk_is_no_token_and_ids_come_from_entries() -> None:
    name = "llamacpp-chat-stream-logprobs.http"
    rec = fetch(name, api="chat")
    text, ids, lps = expected(name, "chat")
    assert rec.error_kind is None, rec.error_message
    assert rec.text == text and rec.token_ids == ids and rec.logprobs == lps
    # the role chunk (`content: null`) is not a token: one chunk per content event
    assert rec.output_tokens == len(ids) and rec.chunk_tokens == [1] * len(ids)


def test_a_non_streaming_answer_to_a_stream_request_is_a_protocol_error() -> None:
    # An engine that ignores `stream: true` and answers with one JSON body is recorded as a
    # protocol error naming it, not read as an empty success.
    rec = fetch("llamacpp-completions-logprobs.http")
    assert rec.error_kind == "protocol_error" and rec.output_tokens == 0
    assert "not an event stream" in (rec.error_message or "")
