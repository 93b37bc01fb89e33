"""The OpenAI-compatible wire format as vLLM speaks it: what the sim accepts, and its errors.

Validation turns JSON into a ``GenerationRequest`` (inside an ``ApiRequest``) or raises
``ApiError`` with vLLM's error body and message. Completions and chat differ only in where the
prompt and the logprobs come from (`_PROMPTS`, one reader per endpoint); the limits they share
are checked once. The answers are rendered by `simengine.responses`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from simengine.engine import GenerationRequest
from simengine.features import ALL_SERVED, Served
from simengine.model import ToyTokenizer, render_chat

DEFAULT_COMPLETION_MAX_TOKENS = 16

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestEntityTooLargeError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def dumps(obj: object) -> str:
    """Compact JSON with raw UTF-8, matching what pydantic's model_dump_json emits."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class ApiError(Exception):
    """An error answered before any streaming starts, as ``{"error": {...}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        err_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or _ERROR_TYPES.get(status, "APIError")

    def body(self) -> bytes:
        return dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.err_type,
                    "param": self.param,
                    "code": self.status,
                }
            }
        ).encode()


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


# vLLM's answer to chat for a model whose tokenizer defines no chat template (raised while
# rendering the messages, so after the request's own validation and the model check).
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must "
    "provide a chat template if the tokenizer does not define one."
)


def _too_many_logprobs(kind: str, requested: int, served: Served, param: str) -> ApiError:
    """vLLM's refusal of more logprobs than --max-logprobs (its input processor's check)."""
    return bad_request(
        f"Requested {kind} logprobs of {requested}, which is greater than max allowed: "
        f"{served.max_logprobs}",
        param,
    )


# --------------------------------------------------------------------------- field readers


def _load_object(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"Invalid JSON body: {exc}") from None
    if not isinstance(obj, dict):
        raise bad_request("The request body must be a JSON object")
    return obj


def _opt_int(obj: dict[str, Any], name: str, *, minimum: int | None = None) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise bad_request(f"`{name}` must be an integer, got {value!r}", name)
    if minimum is not None and value < minimum:
        raise bad_request(f"`{name}` must be at least {minimum}, got {value}", name)
    return value


def _opt_float(obj: dict[str, Any], name: str, *, minimum: float = 0.0) -> float | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"`{name}` must be a number, got {value!r}", name)
    if value < minimum:
        raise bad_request(f"`{name}` must be at least {minimum}, got {value}", name)
    return float(value)


def _opt_bool(obj: dict[str, Any], name: str) -> bool:
    value = obj.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"`{name}` must be a boolean, got {value!r}", name)
    return value


def _stop_strings(obj: dict[str, Any]) -> tuple[str, ...]:
    value = obj.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise bad_request("`stop` must be a string or a list of strings", "stop")


def _stop_token_ids(obj: dict[str, Any], tokenizer: ToyTokenizer) -> frozenset[int]:
    value = obj.get("stop_token_ids")
    if value is None:
        return frozenset()
    if isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and tokenizer.is_valid_id(t) for t in value
    ):
        return frozenset(value)
    raise bad_request("`stop_token_ids` must be a list of valid token ids", "stop_token_ids")


@dataclass(frozen=True, slots=True)
class StreamOptions:
    include_usage: bool = False
    continuous_usage: bool = False


def _stream_options(obj: dict[str, Any], stream: bool) -> StreamOptions:
    value = obj.get("stream_options")
    if value is None:
        return StreamOptions()
    if not isinstance(value, dict):
        raise bad_request("`stream_options` must be an object", "stream_options")
    if not stream:
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    include = _opt_bool(value, "include_usage")
    # As in vLLM, continuous stats only apply when usage is requested at all.
    return StreamOptions(include, include and _opt_bool(value, "continuous_usage_stats"))


# --------------------------------------------------------------------------- requests


Endpoint = Literal["completion", "chat"]


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """A validated generation request plus the options that only shape the response."""

    endpoint: Endpoint
    generation: GenerationRequest
    stream: bool
    stream_options: StreamOptions
    return_token_ids: bool
    # Teacher-forced scoring of the prompt: top-n per prompt position (non-streaming only).
    prompt_logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class _Prompt:
    """What an endpoint's own fields give the checks both endpoints share (`_common`)."""

    ids: list[int]
    logprobs: int | None
    default_max_tokens: int | None
    max_tokens_field: str


def _common(
    obj: dict[str, Any],
    prompt: _Prompt,
    *,
    tokenizer: ToyTokenizer,
    served_model: str,
    max_model_len: int,
    endpoint: Endpoint,
    served: Served,
) -> ApiRequest:
    prompt_ids = prompt.ids
    default_max_tokens = prompt.default_max_tokens
    max_tokens_field = prompt.max_tokens_field
    n = _opt_int(obj, "n")
    if n not in (None, 1):
        raise bad_request("The sim only supports `n=1`", "n")
    max_tokens = _opt_int(obj, max_tokens_field, minimum=1)
    prompt_len = len(prompt_ids)
    if prompt_len > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {prompt_len} input tokens. Please reduce the length of the input "
            "messages.",
            "prompt" if endpoint == "completion" else "messages",
        )
    if max_tokens is None:
        room = max_model_len - prompt_len
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
        if max_tokens < 1:
            raise bad_request(
                f"The prompt ({prompt_len} tokens) leaves no room for output within the "
                f"maximum context length of {max_model_len} tokens.",
                max_tokens_field,
            )
    elif prompt_len + max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            max_tokens_field,
        )
    temperature = _opt_float(obj, "temperature")
    seed = _opt_int(obj, "seed")
    min_tokens = _opt_int(obj, "min_tokens", minimum=0) or 0
    if min_tokens > max_tokens:
        raise bad_request("`min_tokens` must be less than or equal to `max_tokens`", "min_tokens")
    stream = _opt_bool(obj, "stream")
    prompt_logprobs = _prompt_logprobs(obj, stream, served)
    generation = GenerationRequest(
        prompt_token_ids=tuple(prompt_ids),
        max_tokens=max_tokens,
        # Unset means 1.0, as in vLLM without a generation config: only 0 is greedy.
        temperature=1.0 if temperature is None else temperature,
        seed=seed,
        stop=_stop_strings(obj),
        stop_token_ids=_stop_token_ids(obj, tokenizer),
        ignore_eos=_opt_bool(obj, "ignore_eos"),
        min_tokens=min_tokens,
        include_stop_str_in_output=_opt_bool(obj, "include_stop_str_in_output"),
        logprobs=prompt.logprobs,
    )
    request = ApiRequest(
        endpoint=endpoint,
        generation=generation,
        stream=stream,
        # An engine without these ignores the fields, as llama.cpp does: no check, no effect.
        stream_options=_stream_options(obj, stream) if served.stream_usage else StreamOptions(),
        return_token_ids=served.token_ids and _opt_bool(obj, "return_token_ids"),
        prompt_logprobs=prompt_logprobs,
    )
    check_model(obj, served_model)
    return request


def _prompt_logprobs(obj: dict[str, Any], stream: bool, served: Served) -> int | None:
    if not served.prompt_logprobs:
        return None
    value = _opt_int(obj, "prompt_logprobs")
    if value is None:
        return None
    if value < 0 and value != -1:
        raise bad_request("`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs")
    if value == -1 or value > served.max_logprobs:
        # -1 (vLLM: the whole vocabulary) the sim does not serve: refused as over the limit
        raise _too_many_logprobs("prompt", value, served, "prompt_logprobs")
    if stream:
        raise bad_request(
            "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
        )
    return value


def check_model(obj: dict[str, Any], served_model: str) -> None:
    model = obj.get("model")
    if model is None:
        return
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")


def _prompt_ids(value: object, tokenizer: ToyTokenizer) -> list[int]:
    if isinstance(value, str):
        return tokenizer.encode(value)
    if isinstance(value, list):
        if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            bad = [t for t in value if not tokenizer.is_valid_id(t)]
            if bad:
                raise bad_request(f"Token id {bad[0]} is out of vocabulary", "prompt")
            return list(value)
        if len(value) == 1:
            return _prompt_ids(value[0], tokenizer)
        if len(value) > 1:
            raise bad_request("The sim serves one prompt per request", "prompt")
    raise bad_request(
        "`prompt` must be a string, a list of token ids, or a one-element list of either",
        "prompt",
    )


def _completion_prompt(
    obj: dict[str, Any], tokenizer: ToyTokenizer, served_model: str, served: Served
) -> _Prompt:
    if "prompt" not in obj or obj["prompt"] is None:
        raise bad_request("`prompt` is required", "prompt")
    prompt_ids = _prompt_ids(obj["prompt"], tokenizer)
    if _opt_bool(obj, "echo"):
        raise bad_request("The sim does not support `echo`", "echo")
    logprobs = _opt_int(obj, "logprobs", minimum=0) if served.logprobs else None
    # As in vLLM, 0 asks for the chosen token's logprob alone, allowed under any limit.
    if logprobs and logprobs > served.max_logprobs:
        raise _too_many_logprobs("sample", logprobs, served, "logprobs")
    return _Prompt(prompt_ids, logprobs, DEFAULT_COMPLETION_MAX_TOKENS, "max_tokens")


def chat_messages(value: object) -> list[tuple[str, str]]:
    """Flatten messages to (role, text); non-text content parts have no meaning to the toy."""
    if not isinstance(value, list) or not value:
        raise bad_request("`messages` must be a non-empty list", "messages")
    out: list[tuple[str, str]] = []
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request("Each message needs a string `role`", "messages")
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            pieces: list[str] = []
            for part in content:
                if not isinstance(part, dict):
                    raise bad_request("Content parts must be objects", "messages")
                if part.get("type") == "text":
                    if not isinstance(part.get("text"), str):
                        raise bad_request("A text content part needs `text`", "messages")
                    pieces.append(part["text"])
            text = " ".join(pieces)
        else:
            raise bad_request("`content` must be a string or a list of parts", "messages")
        out.append((message["role"], text))
    return out


def _chat_prompt(
    obj: dict[str, Any], tokenizer: ToyTokenizer, served_model: str, served: Served
) -> _Prompt:
    if "messages" not in obj:
        raise bad_request("`messages` is required", "messages")
    prompt_ids = tokenizer.encode(_render_chat(obj, served_model, served))
    want_logprobs = served.logprobs and _opt_bool(obj, "logprobs")
    top = _opt_int(obj, "top_logprobs", minimum=0) if served.logprobs else None
    if top is not None and top > 0 and not want_logprobs:
        raise bad_request(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
        )
    if top and top > served.max_logprobs:
        # vLLM hands top_logprobs to the engine as its sample logprobs, and says so
        raise _too_many_logprobs("sample", top, served, "top_logprobs")
    field = (
        "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
    )
    return _Prompt(prompt_ids, (top or 0) if want_logprobs else None, None, field)


_PROMPTS: dict[Endpoint, Callable[[dict[str, Any], ToyTokenizer, str, Served], _Prompt]] = {
    "completion": _completion_prompt,
    "chat": _chat_prompt,
}


def parse_generation_request(
    endpoint: Endpoint,
    body: bytes,
    tokenizer: ToyTokenizer,
    served_model: str,
    max_model_len: int,
    served: Served = ALL_SERVED,
) -> ApiRequest:
    """A completions or chat body as vLLM validates it: the endpoint's own fields first
    (`_PROMPTS`), then the limits both share, the model's name last."""
    obj = _load_object(body)
    prompt = _PROMPTS[endpoint](obj, tokenizer, served_model, served)
    return _common(
        obj,
        prompt,
        tokenizer=tokenizer,
        served_model=served_model,
        max_model_len=max_model_len,
        endpoint=endpoint,
        served=served,
    )


parse_completion_request = partial(parse_generation_request, "completion")
"""``/v1/completions``: `parse_generation_request` for that endpoint."""
parse_chat_request = partial(parse_generation_request, "chat")
"""``/v1/chat/completions``: `parse_generation_request` for that endpoint."""


def _render_chat(obj: dict[str, Any], served_model: str, served: Served) -> str:
    """The messages through the toy chat template; without one (``--without chat``) vLLM's
    400, after the messages' own checks and the model's, as vLLM renders after both."""
    messages = chat_messages(obj["messages"])
    if not served.chat:
        check_model(obj, served_model)
        raise bad_request(NO_CHAT_TEMPLATE)
    return render_chat(messages)


def kv_transfer_params(body: bytes) -> dict[str, Any] | None:
    """The request's ``kv_transfer_params`` (vLLM's KV-connector hand-off between a prefill
    and a decode worker), read again from a body that a parser has already accepted: only
    workers of a disaggregated engine pay for the second parse."""
    value = _load_object(body).get("kv_transfer_params")
    if value is not None and not isinstance(value, dict):
        raise bad_request("`kv_transfer_params` must be an object", "kv_transfer_params")
    return value


def parse_tokenize_request(
    body: bytes, tokenizer: ToyTokenizer, served_model: str, served: Served = ALL_SERVED
) -> list[int]:
    obj = _load_object(body)
    check_model(obj, served_model)
    if obj.get("prompt") is not None:
        return _prompt_ids(obj["prompt"], tokenizer)
    if obj.get("messages") is not None:
        return tokenizer.encode(_render_chat(obj, served_model, served))
    raise bad_request("Either `prompt` or `messages` is required", "prompt")


def parse_detokenize_request(body: bytes, tokenizer: ToyTokenizer, served_model: str) -> str:
    obj = _load_object(body)
    check_model(obj, served_model)
    tokens = obj.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and tokenizer.is_valid_id(t) for t in tokens
    ):
        raise bad_request("`tokens` must be a list of valid token ids", "tokens")
    return tokenizer.decode(tokens)
