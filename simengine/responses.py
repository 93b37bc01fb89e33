"""The sim's answers in vLLM's wire format: non-streaming bodies, SSE events, logprobs.

Streaming encoders pre-encode the invariant part of every chunk once per request, because at
thousands of events per second re-serialising the same ``id``/``model``/``created`` fields
with ``json.dumps`` is most of the cost. What the sim accepts, and the errors it answers
before any of this, are `simengine.protocol`'s.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from simengine.engine import StreamEvent
from simengine.model import PromptTokenLogprobs, TokenLogprobs, ToyTokenizer
from simengine.protocol import ApiRequest, Endpoint, dumps

DONE_EVENT = b"data: [DONE]\n\n"


def new_request_id(endpoint: Endpoint, base: str | None = None) -> str:
    """Like vLLM: the client's X-Request-Id when it sent one, else a random id."""
    prefix = "cmpl-" if endpoint == "completion" else "chatcmpl-"
    return prefix + (base or uuid.uuid4().hex)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _num(value: float) -> float | None:
    """NaN as null: vLLM's pydantic models serialise a NaN logprob that way in streams."""
    return None if value != value else value


def poison(logprobs: Sequence[TokenLogprobs]) -> tuple[TokenLogprobs, ...]:
    """The same positions with every logprob NaN, as after NaN logits."""
    nan = math.nan
    return tuple(
        TokenLogprobs(lp.token_id, nan, tuple((tid, nan) for tid, _ in lp.top)) for lp in logprobs
    )


def completion_logprobs(
    logprobs: Sequence[TokenLogprobs], tokenizer: ToyTokenizer, text_offset: int
) -> dict[str, Any]:
    """Legacy completions shape: the sampled token plus the top-N in one dict per position."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float | None]] = []
    offsets: list[int] = []
    offset = text_offset
    for lp in logprobs:
        token = tokenizer.token_str(lp.token_id)
        tokens.append(token)
        token_logprobs.append(_num(lp.logprob))
        entry = {token: _num(lp.logprob)}
        for tid, value in lp.top:
            entry.setdefault(tokenizer.token_str(tid), _num(value))
        top_logprobs.append(entry)
        offsets.append(offset)
        offset += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def chat_logprobs(logprobs: Sequence[TokenLogprobs], tokenizer: ToyTokenizer) -> dict[str, Any]:
    """Chat shape: one entry per token with its own top-N list."""
    content = []
    for lp in logprobs:
        token = tokenizer.token_str(lp.token_id)
        content.append(
            {
                "token": token,
                "logprob": _num(lp.logprob),
                "bytes": list(token.encode()),
                "top_logprobs": [
                    {
                        "token": (alt := tokenizer.token_str(tid)),
                        "logprob": _num(value),
                        "bytes": list(alt.encode()),
                    }
                    for tid, value in lp.top
                ],
            }
        )
    return {"content": content}


class StreamEncoder:
    """Renders one request's SSE events; the fixed JSON prefix is built once."""

    def __init__(
        self,
        request: ApiRequest,
        *,
        request_id: str,
        model: str,
        tokenizer: ToyTokenizer,
        created: int | None = None,
        nan_logprobs: bool = False,
    ) -> None:
        self._req = request
        self._nan = nan_logprobs
        self._tokenizer = tokenizer
        self._prompt_tokens = len(request.generation.prompt_token_ids)
        created = int(time.time()) if created is None else created
        chat = request.endpoint == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (
            f'data: {{"id":{dumps(request_id)},"object":"{obj}","created":{created},'
            f'"model":{dumps(model)}'
        )
        self._choice_head = self._head + ',"choices":[{"index":0,'
        self._chat = chat
        self._continuous = request.stream_options.continuous_usage
        # With return_token_ids vLLM sends the prompt ids once, on the first chunk.
        self._prompt_ids_pending = request.return_token_ids

    def _usage_tail(self, completion_tokens: int) -> str:
        if not self._continuous:
            return ""
        return ',"usage":' + dumps(usage(self._prompt_tokens, completion_tokens))

    def _prompt_ids(self) -> str:
        self._prompt_ids_pending = False
        return dumps(list(self._req.generation.prompt_token_ids))

    def role_event(self) -> bytes:
        """Chat's first chunk: the role, no token."""
        parts = [
            self._choice_head,
            '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]',
        ]
        if self._prompt_ids_pending:
            parts.append(',"prompt_token_ids":' + self._prompt_ids())
        parts.append(self._usage_tail(0))
        parts.append("}\n\n")
        return "".join(parts).encode()

    def event(self, ev: StreamEvent) -> bytes:
        tokenizer = self._tokenizer
        logprobs = ev.logprobs
        if logprobs is not None and self._nan:
            logprobs = poison(logprobs)
        if self._chat:
            body = '"delta":{"content":' + dumps(ev.text) + "}"
            lps = "null" if logprobs is None else dumps(chat_logprobs(logprobs, tokenizer))
        else:
            body = '"text":' + dumps(ev.text)
            lps = (
                "null"
                if logprobs is None
                else dumps(completion_logprobs(logprobs, tokenizer, ev.text_offset))
            )
        parts = [self._choice_head, body, ',"logprobs":', lps]
        if ev.finish_reason is None:
            parts.append(',"finish_reason":null,"stop_reason":null')
        else:
            parts.append(',"finish_reason":"' + ev.finish_reason + '","stop_reason":')
            parts.append(dumps(ev.stop_reason))
        if self._req.return_token_ids:
            if self._prompt_ids_pending:
                parts.append(',"prompt_token_ids":' + self._prompt_ids())
            parts.append(',"token_ids":' + dumps(list(ev.token_ids)))
        parts.append("}]")
        parts.append(self._usage_tail(ev.completion_tokens))
        parts.append("}\n\n")
        return "".join(parts).encode()

    def usage_event(self, completion_tokens: int) -> bytes:
        """The final ``choices: []`` chunk of ``stream_options.include_usage``."""
        return (
            self._head
            + ',"choices":[],"usage":'
            + dumps(usage(self._prompt_tokens, completion_tokens))
            + "}\n\n"
        ).encode()


def stream_error_event(message: str) -> bytes:
    """A mid-stream failure as vLLM reports it: HTTP 200 already sent, so an error event.

    vLLM's stream generators answer any exception with its default streaming error, type
    ``BadRequestError`` and code 400, whatever the cause; the sim does the same.
    """
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return b"data: " + dumps({"error": error}).encode() + b"\n\n"


def prompt_logprobs_json(
    scores: Sequence[PromptTokenLogprobs], tokenizer: ToyTokenizer
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's shape: None for the first prompt token, then {token_id: {logprob, rank,
    decoded_token}} with the actual token first and the top-n after it."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for score in scores:
        entry: dict[str, dict[str, Any]] = {
            str(score.token_id): {
                "logprob": _num(score.logprob),
                "rank": score.rank,
                "decoded_token": tokenizer.token_str(score.token_id),
            }
        }
        for rank, (tid, value) in enumerate(score.top, start=1):
            entry[str(tid)] = {
                "logprob": _num(value),
                "rank": rank,
                "decoded_token": tokenizer.token_str(tid),
            }
        out.append(entry)
    return out


def full_response(
    request: ApiRequest,
    events: Sequence[StreamEvent],
    *,
    request_id: str,
    model: str,
    tokenizer: ToyTokenizer,
    created: int | None = None,
    prompt_scores: Sequence[PromptTokenLogprobs] | None = None,
    kv_transfer: dict[str, Any] | None = None,
) -> bytes:
    """Non-streaming body: the same events, merged into one choice; a prefill worker's KV
    hand-off goes beside the choices, where vLLM puts ``kv_transfer_params``."""
    created = int(time.time()) if created is None else created
    text = "".join(ev.text for ev in events)
    token_ids = [t for ev in events for t in ev.token_ids]
    all_lps = [lp for ev in events for lp in (ev.logprobs or ())]
    last = events[-1]
    prompt_tokens = len(request.generation.prompt_token_ids)
    want_lps = request.generation.logprobs is not None
    choice: dict[str, Any] = {"index": 0}
    if request.endpoint == "chat":
        choice["message"] = {
            "role": "assistant",
            "content": text,
            "reasoning_content": None,
            "tool_calls": [],
        }
        choice["logprobs"] = chat_logprobs(all_lps, tokenizer) if want_lps else None
    else:
        choice["text"] = text
        choice["logprobs"] = completion_logprobs(all_lps, tokenizer, 0) if want_lps else None
    choice["finish_reason"] = last.finish_reason
    choice["stop_reason"] = last.stop_reason
    prompt_lps = None if prompt_scores is None else prompt_logprobs_json(prompt_scores, tokenizer)
    if request.endpoint == "completion" and prompt_lps is not None:
        choice["prompt_logprobs"] = prompt_lps
    if request.return_token_ids:
        if request.endpoint == "completion":
            choice["prompt_token_ids"] = list(request.generation.prompt_token_ids)
        choice["token_ids"] = token_ids
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion" if request.endpoint == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, last.completion_tokens),
    }
    if request.endpoint == "chat" and prompt_lps is not None:
        # vLLM puts a chat request's prompt logprobs beside the choices, not inside one.
        body["prompt_logprobs"] = prompt_lps
    if request.return_token_ids and request.endpoint == "chat":
        body["prompt_token_ids"] = list(request.generation.prompt_token_ids)
    if kv_transfer is not None:
        body["kv_transfer_params"] = kv_transfer
    return dumps(body).encode()
