"""What an engine can do, learned by asking it: a handful of tiny requests at readiness.

Engines differ in what they return beyond text (the field's servers, as their sources and our
captures show): vLLM has `prompt_logprobs`, `return_token_ids` and up to `max_logprobs` (20 by
default) top logprobs; llama.cpp ignores `prompt_logprobs` and `return_token_ids` but gives
each logprob entry its token `id` (../shared/captures/); an OpenAI-compatible server may answer
an unknown field with a 400, or silently ignore it. The gate asks rather than assumes, so a check
never holds an engine for a field its reference does not have either (gate/analysis/compat.py).

Each feature is one request with `max_tokens` 2 (token ids and prompt token ids share one;
`top_logprobs_max` tries 20, then 5, then 1), answered when the response is a 200 whose body
really carries the feature; anything else (an error status, a body without it, a transport
failure) is "not supported", with what was seen in `problems`. Bodies are read up to
`MAX_CAPABILITY_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import httpx

from loadgen.client import IDENTITY_HEADERS, Target, make_client, read_capped
from loadgen.engine_text import excerpt
from loadgen.logprobs import parse_logprobs

__all__ = ["FEATURES", "MAX_CAPABILITY_BODY_BYTES", "Capabilities", "ask_version", "discover"]

MAX_CAPABILITY_BODY_BYTES = 256 << 10
_TOP_K_TRIES = (20, 5, 1)
_PROMPT = "The quick brown fox"


@dataclass(frozen=True)
class Capabilities:
    """What one engine answered when asked (module docstring). `top_logprobs_max`: the largest
    of 20, 5 and 1 top logprobs per token it returned in full (None: none)."""

    completions: bool = False
    chat: bool = False
    logprobs: bool = False
    top_logprobs_max: int | None = None
    prompt_logprobs: bool = False
    token_ids: bool = False
    prompt_token_ids: bool = False
    stream_usage: bool = False
    problems: tuple[str, ...] = field(default_factory=tuple)
    # Asked with vLLM's `return_tokens_as_token_ids`, it named every token `token_id:N` (in its
    # tokens and top-k keys): ids, where its text keys would merge tokens of the same text.
    tokens_by_id: bool = False

    FEATURES: ClassVar[tuple[str, ...]] = (
        "completions",
        "chat",
        "logprobs",
        "prompt_logprobs",
        "token_ids",
        "prompt_token_ids",
        "stream_usage",
    )

    def has(self, feature: str) -> bool:
        return bool(getattr(self, feature))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "problems"} | {
            "problems": list(self.problems)
        }


FEATURES = Capabilities.FEATURES


class _Clock:
    """The discovery's budget: every ask gets what is left of it (at most the target's own
    deadline); once spent, the asks left are not sent."""

    def __init__(self, budget_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        self.end = None if budget_s is None else loop.time() + budget_s
        self.budget_s = budget_s

    def left(self, target: Target) -> float | None:
        if self.end is None:
            return target.deadline_s
        left = self.end - asyncio.get_running_loop().time()
        return max(0.0, left if target.deadline_s is None else min(left, target.deadline_s))


async def _post(
    http: httpx.AsyncClient,
    target: Target,
    api: str,
    body: Mapping[str, Any],
    clock: _Clock | None = None,
) -> tuple[int | None, Any, str | None]:
    """(status, parsed body or the raw text for a stream, problem) of one request."""
    limit = clock.left(target) if clock is not None else target.deadline_s
    if limit is not None and limit <= 0.0:
        budget = clock.budget_s if clock is not None else 0.0
        return None, None, f"not asked: the discovery's {budget:g} s were spent"
    base = target.base_url.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    url = base + ("/completions" if api == "completions" else "/chat/completions")
    payload = {"model": target.model, **body}
    try:
        async with (
            asyncio.timeout(limit),
            http.stream(
                "POST", url, json=payload, headers=IDENTITY_HEADERS, timeout=target.timeout_s
            ) as response,
        ):
            raw, more = await read_capped(response, MAX_CAPABILITY_BODY_BYTES)
            status = response.status_code
    except TimeoutError:
        return None, None, f"no answer within {limit:g} s"
    except httpx.HTTPError as exc:
        return None, None, f"{type(exc).__name__}: {excerpt(str(exc))}"
    if more:
        return status, None, f"answer over {MAX_CAPABILITY_BODY_BYTES} bytes"
    text = raw.decode("utf-8", "replace")
    if status != 200:
        return status, None, f"HTTP {status}: {excerpt(text)}"
    if body.get("stream"):
        return status, text, None
    try:
        return status, json.loads(text), None
    except ValueError:
        return status, None, f"HTTP 200 but not JSON: {excerpt(text)}"


def _choice(doc: Any) -> Mapping[str, Any] | None:
    choices = doc.get("choices") if isinstance(doc, Mapping) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return choices[0]
    return None


def _stream_has_usage(text: str) -> bool:
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        usage = event.get("usage") if isinstance(event, Mapping) else None
        if isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
            return True
    return False


async def discover(
    target: Target, *, client: httpx.AsyncClient | None = None, budget_s: float | None = None
) -> Capabilities:
    """Ask `target` for each feature (module docstring), all within `budget_s` seconds (an
    engine that hangs is "not supported" for what it did not answer); never raises for an
    answer."""
    if client is None:
        async with make_client(target, 2, lean=False) as owned:
            return await discover(target, client=owned, budget_s=budget_s)
    clock = _Clock(budget_s)

    async def post(api: str, body: Mapping[str, Any]) -> tuple[int | None, Any, str | None]:
        # One more try after a transport failure or a 5xx: a blip is not a missing feature.
        got = await _post(client, target, api, body, clock)
        status, _, problem = got
        spent = problem is not None and problem.startswith("not asked")
        if not spent and (status is None or status >= 500):
            got = await _post(client, target, api, body, clock)
        return got

    problems: list[str] = []
    base = {"prompt": _PROMPT, "max_tokens": 2, "temperature": 0.0}

    def note(feature: str, problem: str | None, fallback: str) -> None:
        problems.append(f"{feature}: {problem or fallback}")

    _, doc, problem = await post("completions", base)
    completions = _choice(doc) is not None
    if not completions:
        note("completions", problem, "no choices in the answer")

    _, doc, problem = await post(
        "chat",
        {"messages": [{"role": "user", "content": _PROMPT}], "max_tokens": 2},
    )
    ch = _choice(doc)
    message = ch.get("message") if ch is not None else None
    chat = isinstance(message, Mapping) and "content" in message
    if not chat:
        note("chat", problem, "no message in the answer (no chat template?)")

    top_max, token_ids_from_entries, tokens_by_id = await _top_logprobs(post, base, note)
    logprobs = top_max is not None

    # Prompt logprobs and token ids are asked apart: an engine that refuses one of them (vLLM
    # refuses prompt logprobs over its --max-logprobs) may still serve the other.
    _, doc, problem = await post("completions", base | {"prompt_logprobs": 1})
    ch = _choice(doc)
    prompt_lps = ch.get("prompt_logprobs") if ch is not None else None
    prompt_logprobs = isinstance(prompt_lps, list) and len(prompt_lps) > 0
    if not prompt_logprobs:
        note("prompt_logprobs", problem, "the answer has no prompt_logprobs")

    token_ids, prompt_token_ids = await _token_ids(post, base, note, token_ids_from_entries)

    _, text, problem = await post(
        "completions",
        base | {"stream": True, "stream_options": {"include_usage": True}},
    )
    stream_usage = isinstance(text, str) and _stream_has_usage(text)
    if not stream_usage:
        note("stream_usage", problem, "no usage in the stream")
    return Capabilities(
        completions=completions,
        chat=chat,
        logprobs=logprobs,
        top_logprobs_max=top_max,
        prompt_logprobs=prompt_logprobs,
        token_ids=token_ids,
        prompt_token_ids=prompt_token_ids,
        stream_usage=stream_usage,
        problems=tuple(p[:300] for p in problems[:20]),
        tokens_by_id=tokens_by_id,
    )


_Post = Callable[[str, Mapping[str, Any]], Awaitable[tuple[int | None, Any, str | None]]]
_Note = Callable[[str, str | None, str], None]


async def _top_logprobs(
    post: _Post, base: dict[str, Any], note: _Note
) -> tuple[int | None, bool, bool]:
    """The most top logprobs the engine gives (None: none), whether its entries name token
    ids, and whether it keys its top logprobs by id (`discover`)."""
    top_max: int | None = None
    token_ids_from_entries = False
    tokens_by_id = False
    for k in _TOP_K_TRIES:
        # vLLM keys its top logprobs by text, and tokens with the same text collapse into one
        # key (logprobs.py): asked to name them by id, it counts them all. An engine that does
        # not know the field ignores it.
        ask = {"logprobs": k, "return_tokens_as_token_ids": True}
        _, doc, problem = await post("completions", base | ask)
        ch = _choice(doc)
        parsed = parse_logprobs(ch.get("logprobs")) if ch is not None else None
        if parsed is not None and parsed.logprobs and parsed.top:
            if all(len(t) >= k for t in parsed.top_ids or parsed.top):
                top_max = k
                token_ids_from_entries = parsed.ids is not None
                tokens_by_id = parsed.shape == "completions" and parsed.top_ids is not None
                break
            problem = f"asked for {k} top logprobs, got {min(len(t) for t in parsed.top)}"
        note(f"logprobs {k}", problem, "no logprobs in the answer")
    return top_max, token_ids_from_entries, tokens_by_id


async def _token_ids(
    post: _Post, base: dict[str, Any], note: _Note, token_ids_from_entries: bool
) -> tuple[bool, bool]:
    """Whether the engine returns its output's token ids, and its prompt's (`discover`)."""
    _, doc, problem = await post("completions", base | {"return_token_ids": True})
    ch = _choice(doc)
    ids = ch.get("token_ids") if ch is not None else None
    token_ids = (isinstance(ids, list) and len(ids) > 0) or token_ids_from_entries
    prompt_ids = ch.get("prompt_token_ids") if ch is not None else None
    if prompt_ids is None and isinstance(doc, Mapping):
        prompt_ids = doc.get("prompt_token_ids")  # some versions put it beside the choices
    prompt_token_ids = isinstance(prompt_ids, list) and len(prompt_ids) > 0
    if not token_ids:
        note("token_ids", problem, "no token_ids in the answer nor ids in its logprobs")
    if not prompt_token_ids:
        note("prompt_token_ids", problem, "no prompt_token_ids in the answer")
    return token_ids, prompt_token_ids


MAX_VERSION_CHARS = 200


async def ask_version(target: Target, *, budget_s: float = 5.0) -> tuple[str | None, str | None]:
    """`(version, None)` from the engine's `GET /version` (`{"version": "0.9.2"}`: vLLM's
    api_server and the sim answer it), or `(None, why)`; never raises. The version is
    bounded: it is the test bed's record, not something to trust."""
    base = target.base_url.rstrip("/").removesuffix("/v1")
    try:
        async with (
            make_client(target, 1, lean=False) as client,
            asyncio.timeout(budget_s),
            client.stream("GET", f"{base}/version") as r,
        ):
            status = r.status_code
            body, _ = await read_capped(r, MAX_VERSION_CHARS * 4)
    except (httpx.HTTPError, TimeoutError, OSError) as exc:
        return None, f"not answered: {type(exc).__name__}"
    if status != 200:
        return None, f"GET /version answered {status}"
    try:
        version = json.loads(body).get("version")
    except (ValueError, AttributeError):
        version = None
    if not isinstance(version, str) or not version:
        return None, "GET /version named no version"
    return version[:MAX_VERSION_CHARS], None
