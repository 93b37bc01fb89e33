"""The load generator and the probes against real vLLM's exact answers (vLLM 0.32.0, captured by
bench/vllm/capture; tests/support/captures/vllm/README.md says how and what each shows). Each
expected value is read from the capture here, independently of the code under test."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from capture_replay import capture_path, replay, split_capture

from loadgen.capabilities import Capabilities, discover
from loadgen.client import RequestSpec, Target, make_client, send_request
from loadgen.logprobs import parse_logprobs
from loadgen.records import RequestRecord
from loadgen.tokens import TokenCounter


def fetch(name: str, api: str = "completions") -> RequestRecord:
    async def main() -> RequestRecord:
        async with replay(name) as url:
            target = Target("vllm", url, api=api, timeout_s=5.0)  # type: ignore[arg-type]
            spec = RequestSpec(0, "The gate compares", 6, {"logprobs": 3})
            async with make_client(target, 1) as client:
                return await send_request(client, target, spec, time.monotonic_ns())

    return asyncio.run(main())


def events(name: str) -> list[dict]:
    _, body = split_capture(capture_path(name).read_bytes())
    return [
        json.loads(line[6:])
        for line in body.decode().splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def whole(name: str) -> dict:
    _, body = split_capture(capture_path(name).read_bytes())
    return json.loads(body)


def test_completions_stream_one_token_per_event_with_continuous_usage() -> None:
    name = "vllm-completions-stream-logprobs.http"
    rec = fetch(name)
    evs = events(name)
    choices = [c for e in evs for c in e["choices"]]
    assert rec.error_kind is None, rec.error_message
    assert rec.text == "".join(c["text"] for c in choices)
    assert rec.token_ids == [i for c in choices for i in c["token_ids"]]
    assert rec.logprobs == [v for c in choices for v in c["logprobs"]["token_logprobs"]]
    final = evs[-1]["usage"]
    assert rec.output_tokens == final["completion_tokens"] == 6
    assert rec.prompt_tokens == final["prompt_tokens"]
    # a token whose text is "" (a held-back byte) is still a token: usage counts it
    assert "" in [c["text"] for c in choices]
    assert rec.chunk_tokens == [1] * 6
    assert rec.finish_reason == "length"


def test_chat_streams_role_event_with_empty_content_is_no_token() -> None:
    name = "vllm-chat-stream-logprobs.http"
    rec = fetch(name, api="chat")
    evs = events(name)
    first = evs[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"]["completion_tokens"] == 0
    assert "prompt_token_ids" in first  # beside the choices, not in them
    assert rec.error_kind is None, rec.error_message
    assert rec.output_tokens == evs[-1]["usage"]["completion_tokens"] == 6
    assert len(rec.chunk_ns) == 6  # the role event is not the first token
    assert rec.prompt_tokens == evs[-1]["usage"]["prompt_tokens"]  # the chat template's tokens
    assert rec.token_ids == [i for e in evs for c in e["choices"] for i in c.get("token_ids", [])]


def test_errors_come_as_json_with_their_status_before_any_stream() -> None:
    for name, status in (
        ("vllm-error-context-too-long.http", 400),
        ("vllm-error-bad-parameter.http", 400),
        ("vllm-error-unknown-model.http", 404),
    ):
        rec = fetch(name)
        said = whole(name)["error"]
        assert rec.status == status == said["code"]
        assert rec.error_kind == "http_4xx"
        assert said["message"][:60] in (rec.error_message or "")
        assert rec.first_token_ns is None and rec.output_tokens == 0


def test_top_logprobs_keyed_by_text_collapse_and_by_id_do_not() -> None:
    by_text = whole("vllm-completions-logprobs20.http")["choices"][0]["logprobs"]
    sizes = [len(t) for t in by_text["top_logprobs"]]
    assert min(sizes) < 20  # tokens with the same text share a key: vLLM's own answer
    parsed = parse_logprobs(by_text)
    assert parsed is not None and parsed.ids is None and parsed.top_ids is None

    choice = whole("vllm-completions-logprobs20-token-ids.http")["choices"][0]
    parsed = parse_logprobs(choice["logprobs"])
    assert parsed is not None
    assert parsed.ids == choice["token_ids"]  # "token_id:N" read as N
    assert parsed.top_ids is not None and [len(t) for t in parsed.top_ids] == [20] * 8
    for pos, top in enumerate(parsed.top_ids):
        assert top[parsed.ids[pos]] == parsed.logprobs[pos]  # greedy: the token is its top-1


def test_the_capability_probe_counts_top_logprobs_by_id() -> None:
    """Asked for 20 top logprobs with `return_tokens_as_token_ids`, vLLM names 20 distinct ids:
    top-20 is served (by text the probe saw 16-19 and fell back to 5)."""

    async def main() -> Capabilities:
        async with replay("vllm-completions-logprobs20-token-ids.http") as url:
            return await discover(Target("vllm", url, timeout_s=5.0))

    caps = asyncio.run(main())
    assert caps.top_logprobs_max == 20 and caps.logprobs and caps.token_ids
    assert caps.tokens_by_id  # so the probes may ask by id when the other engine does too


def test_an_engine_answering_text_keys_does_not_name_tokens_by_id() -> None:
    async def main() -> Capabilities:
        async with replay("vllm-completions-logprobs20.http") as url:
            return await discover(Target("vllm", url, timeout_s=5.0))

    caps = asyncio.run(main())
    assert not caps.tokens_by_id  # the field ignored (text keys): never asked by id


def test_tokenize_at_the_root_counts_a_prompt() -> None:
    async def main() -> int:
        async with replay("vllm-tokenize.http") as url:
            target = Target("vllm", url + "/v1", timeout_s=5.0)
            async with httpx.AsyncClient() as client:
                counter = await TokenCounter.connect(target, client)
                assert counter.source == "engine"
                return await counter.count("The gate compares")

    assert asyncio.run(main()) == whole("vllm-tokenize.http")["count"]


def test_prompt_logprobs_first_entry_is_null_and_ids_are_strings() -> None:
    lps = whole("vllm-completions-logprobs.http")["choices"][0]["prompt_logprobs"]
    assert lps[0] is None
    for entry in lps[1:]:
        assert all(k.isdigit() for k in entry)  # token ids as JSON keys: strings
        assert all({"logprob", "rank", "decoded_token"} <= set(v) for v in entry.values())
