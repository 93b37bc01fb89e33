"""The OpenAI schema checks of a compatibility probe's answer (a body or an SSE stream)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from loadgen.suite.wire import ProbeKind

# --------------------------------------------------------------------------- schema checks

_FINISH = {"stop", "length", "tool_calls", "content_filter", "function_call", "abort", None}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_error(payload: bytes) -> list[str]:
    try:
        obj = json.loads(payload)
    except ValueError:
        return ["error body is not JSON"]
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return ["error body lacks {'error': {'message': ...}}"]
    return []


def _check_usage(usage: Any, where: str) -> list[str]:
    if not isinstance(usage, dict):
        return [f"{where}: usage is not an object"]
    return [
        f"{where}: usage.{key} is not an integer"
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
        if not _is_int(usage.get(key))
    ]


def _check_logprobs(lp: Any, api: ProbeKind, where: str) -> list[str]:
    # On completions an engine may answer in vLLM's lists or in the chat-style content list
    # (llama.cpp: shared/captures/llamacpp-completions-logprobs.http); both are the API's.
    is_content = isinstance(lp, dict) and isinstance(lp.get("content"), list)
    if api == "completions" and not is_content:
        if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
            return [f"{where}: logprobs lacks token_logprobs (or a content list)"]
        if not isinstance(lp.get("tokens"), list):
            return [f"{where}: logprobs lacks tokens"]
        return []
    if not is_content:
        return [f"{where}: logprobs lacks content"]
    for entry in lp["content"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), int | float):
            return [f"{where}: a logprobs entry lacks logprob"]
    return []


def _check_choice(choice: Any, api: ProbeKind, body: Mapping[str, Any], chunk: bool) -> list[str]:
    where = "chunk choice" if chunk else "choice"
    if not isinstance(choice, dict):
        return [f"{where} is not an object"]
    problems: list[str] = []
    if not _is_int(choice.get("index")):
        problems.append(f"{where}: index is not an integer")
    if choice.get("finish_reason") not in _FINISH:
        problems.append(f"{where}: unknown finish_reason {choice.get('finish_reason')!r}")
    if api == "completions":
        if not isinstance(choice.get("text"), str):
            problems.append(f"{where}: text is not a string")
    else:
        key = "delta" if chunk else "message"
        message = choice.get(key)
        if not isinstance(message, dict):
            problems.append(f"{where}: {key} is not an object")
        else:
            content = message.get("content")
            if content is not None and not isinstance(content, str):
                problems.append(f"{where}: {key}.content is not a string or null")
            if not chunk and message.get("role") != "assistant":
                problems.append(f"{where}: message.role is not 'assistant'")
            calls = message.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                problems.append(f"{where}: {key}.tool_calls is not a list")
    wants_logprobs = body.get("logprobs") not in (None, False, 0)
    if wants_logprobs and not chunk:
        problems.extend(_check_logprobs(choice.get("logprobs"), api, where))
    return problems


def check_body(payload: bytes, api: ProbeKind, body: Mapping[str, Any]) -> list[str]:
    try:
        obj = json.loads(payload)
    except ValueError:
        return ["body is not JSON"]
    if not isinstance(obj, dict):
        return ["body is not a JSON object"]
    expected = "text_completion" if api == "completions" else "chat.completion"
    problems: list[str] = []
    if obj.get("object") != expected:
        problems.append(f"object is {obj.get('object')!r}, not {expected!r}")
    if not isinstance(obj.get("id"), str):
        problems.append("id is not a string")
    if not isinstance(obj.get("model"), str):
        problems.append("model is not a string")
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        return [*problems, "choices is not a non-empty list"]
    for choice in choices:
        problems.extend(_check_choice(choice, api, body, chunk=False))
    problems.extend(_check_usage(obj.get("usage"), "body"))
    usage = obj.get("usage")
    limit = body.get("max_tokens")
    used = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(limit, int) and isinstance(used, int) and used > limit:
        problems.append(f"{used} completion tokens > max_tokens {limit}")
    if body.get("response_format") == {"type": "json_object"} and api == "chat":
        content = (
            choices[0].get("message", {}).get("content") if isinstance(choices[0], dict) else None
        )
        try:
            json.loads(content or "")
        except ValueError:
            problems.append("response_format json_object: content is not JSON")
    return problems


def check_stream(payload: bytes, api: ProbeKind, body: Mapping[str, Any]) -> list[str]:
    from loadgen.sse import DONE, SSELimitError, SSEParser

    parser = SSEParser()
    try:
        events = [*parser.feed(payload), *parser.close()]
    except SSELimitError as exc:
        return [str(exc)]
    if not events:
        return ["stream has no events"]
    problems: list[str] = []
    if events[-1].data != DONE:
        problems.append("stream does not end with data: [DONE]")
    expected = "text_completion" if api == "completions" else "chat.completion.chunk"
    tokens = 0
    saw_usage = False
    for event in events:
        if event.data == DONE:
            continue
        try:
            obj = json.loads(event.data)
        except ValueError:
            problems.append("an event is not JSON")
            continue
        if not isinstance(obj, dict):
            problems.append("an event is not a JSON object")
            continue
        if "error" in obj:
            problems.append(f"error event: {obj['error']!r:.200}")
            continue
        if obj.get("object") != expected:
            problems.append(f"chunk object is {obj.get('object')!r}, not {expected!r}")
        choices = obj.get("choices")
        if not isinstance(choices, list):
            problems.append("chunk choices is not a list")
            continue
        if not choices:
            saw_usage = True
            problems.extend(_check_usage(obj.get("usage"), "final chunk"))
        for choice in choices:
            problems.extend(_check_choice(choice, api, body, chunk=True))
            if isinstance(choice, dict):
                piece = (
                    choice.get("text")
                    if api == "completions"
                    else (choice.get("delta") or {}).get("content")
                )
                tokens += 1 if piece else 0
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") and not saw_usage:
        problems.append("include_usage requested but no usage chunk")
    limit = body.get("max_tokens")
    if isinstance(limit, int) and tokens > limit:
        problems.append(f"{tokens} content events > max_tokens {limit}")
    return sorted(set(problems), key=problems.index)
