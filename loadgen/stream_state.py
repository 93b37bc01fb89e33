"""What one streamed answer carries, read event by event: tokens, text, ids, logprobs, usage,
and the error an engine reports in the stream.

:class:`StreamState` runs once per streamed event (``loadgen.client`` feeds it the events the
SSE parser yields, each with the receive stamp of the read that delivered it), so it is kept
to dict lookups and exact type checks. Token counting per event, most exact first: the delta
of ``usage.completion_tokens``, else the event's ``token_ids``, else its chosen-token
logprobs, else 1 per event with content (the client module's docstring says why).
"""

from __future__ import annotations

import json
import math
from typing import Any

from loadgen.engine_text import MAX_MESSAGE, error_message, excerpt
from loadgen.records import ErrorKind, RequestRecord
from loadgen.sse import DONE, ServerSentEvent

_NONFINITE_LOGPROB = -9999.0  # vLLM's own JSON stand-in for -inf
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner, without json.loads' Python wrappers


class StreamState:
    """Accumulates one response; ``handle`` returns False once the stream is finished."""

    __slots__ = (
        "chunk_ns",
        "chunk_tokens",
        "counted",
        "done",
        "end_ns",
        "error_kind",
        "error_message",
        "finish_reason",
        "first_token_ns",
        "ids_partial",
        "logprobs",
        "prompt_tokens",
        "text",
        "token_ids",
        "usage_completion",
    )

    def __init__(self) -> None:
        self.chunk_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.counted = 0  # tokens attributed to events so far
        self.done = False
        self.end_ns: int | None = None
        self.error_kind: ErrorKind | None = None
        self.error_message: str | None = None
        self.finish_reason: str | None = None
        self.first_token_ns: int | None = None
        self.ids_partial = False  # some event's logprob entries had no ids: ids unknown
        self.logprobs: list[float] | None = None
        self.prompt_tokens: int | None = None
        self.text: list[str] = []
        self.token_ids: list[int] | None = None
        self.usage_completion: int | None = None

    def fail(self, kind: ErrorKind, message: str) -> None:
        if self.error_kind is None:
            self.error_kind = kind
            self.error_message = message[:MAX_MESSAGE]

    def handle(self, event: ServerSentEvent, now: int) -> bool:
        # This runs once per streamed event: keep it to dict lookups and exact type checks
        # (``type(x) is int`` also rejects bools, which JSON cannot produce as numbers).
        self.end_ns = now
        data = event.data
        if data == DONE:
            self.done = True
            return False
        try:
            obj = decode(data)
        except ValueError:
            self.fail("protocol_error", f"non-JSON event data: {data[:200]!r}")
            return False
        if type(obj) is not dict:
            self.fail("protocol_error", f"event data is not a JSON object: {data[:200]!r}")
            return False
        if "error" in obj or obj.get("object") == "error":
            message = error_message(obj)
            self.fail("stream_error", excerpt(message) if message else "error event in stream")
            return False
        usage = obj.get("usage")
        completion: int | None = None
        if type(usage) is dict:
            prompt = usage.get("prompt_tokens")
            if type(prompt) is int:
                self.prompt_tokens = prompt
            value = usage.get("completion_tokens")
            if type(value) is int:
                completion = self.usage_completion = value
        choices = obj.get("choices")
        if choices is None or choices == []:
            return True  # usage-only final chunk, or a chunk we have no use for
        if type(choices) is not list:
            self.fail("protocol_error", "'choices' is not a list")
            return False
        return self._choices(choices, completion, now)

    def _choices(self, choices: list[Any], completion: int | None, now: int) -> bool:
        # ``index`` is deliberately ignored: we send n=1, and some servers number chunks
        # rather than choices, so every choice in an event is taken as part of one stream.
        has_content = False
        n_ids = 0
        n_logprobs = 0
        for choice in choices:
            if type(choice) is not dict:
                self.fail("protocol_error", "a choice is not a JSON object")
                return False
            piece = choice.get("text")
            delta = choice.get("delta")
            if type(delta) is dict:
                content = delta.get("content")
                if type(content) is str:
                    piece = content
                for key in ("reasoning_content", "reasoning"):
                    value = delta.get(key)
                    if type(value) is str and value:
                        has_content = True
            if type(piece) is str and piece:
                self.text.append(piece)
                has_content = True
            ids = choice.get("token_ids")
            if type(ids) is list:
                clean = [i for i in ids if type(i) is int]
                if self.token_ids is None:
                    self.token_ids = clean
                else:
                    self.token_ids.extend(clean)
                n_ids += len(clean)
            logprobs = choice.get("logprobs")
            if logprobs is not None:
                n_logprobs += self._logprobs(logprobs, entry_ids=type(ids) is not list)
            reason = choice.get("finish_reason")
            if type(reason) is str:
                self.finish_reason = reason
        if completion is not None:
            # Cumulative usage minus what earlier events were credited: exact with continuous
            # usage, and a server that reports usage only on its last content event still
            # gets a correct total (credited to that event).
            tokens = max(completion - self.counted, 0)
        elif n_ids:
            tokens = n_ids
        elif n_logprobs:
            tokens = n_logprobs
        else:
            tokens = 1 if has_content else 0
        if tokens > 0:
            self.counted += tokens
            if self.first_token_ns is None:
                self.first_token_ns = now
            self.chunk_ns.append(now)
            self.chunk_tokens.append(tokens)
        return True

    def _logprobs(self, logprobs: Any, entry_ids: bool = False) -> int:
        """Count the event's logprobs (vLLM's completions lists, or the chat-style `content`
        list that llama.cpp also sends on /v1/completions); with `entry_ids` (the event had
        no `token_ids`) the `id` of each content entry is the token id, where every entry
        has one (llama.cpp's): otherwise the output's ids are unknown."""
        if type(logprobs) is not dict:
            return 0
        values: list[Any] = []
        if type(logprobs.get("token_logprobs")) is list:  # completions
            values = logprobs["token_logprobs"]
        elif type(logprobs.get("content")) is list:  # chat
            entries = [e for e in logprobs["content"] if type(e) is dict]
            values = [e.get("logprob") for e in entries]
            if entry_ids and entries:
                found = [i for e in entries if type(i := e.get("id")) is int]
                if len(found) == len(entries) and not self.ids_partial:
                    if self.token_ids is None:
                        self.token_ids = []
                    self.token_ids.extend(found)
                else:
                    self.ids_partial = True
        chosen = [_finite(v) for v in values if _is_number(v)]
        if chosen:
            if self.logprobs is None:
                self.logprobs = chosen
            else:
                self.logprobs.extend(chosen)
        return len(chosen)

    def fill(self, record: RequestRecord) -> None:
        record.first_token_ns = self.first_token_ns
        record.end_ns = self.end_ns
        record.error_kind = self.error_kind
        record.error_message = self.error_message
        record.output_tokens = (
            self.usage_completion if self.usage_completion is not None else sum(self.chunk_tokens)
        )
        record.prompt_tokens = self.prompt_tokens
        record.chunk_ns = self.chunk_ns
        record.chunk_tokens = self.chunk_tokens
        record.text = "".join(self.text)
        record.token_ids = None if self.ids_partial else self.token_ids
        record.logprobs = self.logprobs
        record.finish_reason = self.finish_reason


def decode(data: str) -> Any:
    """``json.loads`` for one event's data, calling the C scanner directly for the usual
    compact object; anything else (whitespace, trailing bytes, errors) takes ``json.loads``
    so the result and the errors are exactly its."""
    if data[:1] == "{":
        try:
            obj, end = _scan(data, 0)
        except StopIteration:
            pass
        else:
            if end == len(data):
                return obj
    return json.loads(data)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else _NONFINITE_LOGPROB
