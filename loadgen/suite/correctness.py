"""The correctness suite: greedy probes with logprobs, optionally under background load, and
teacher-forced scoring of a continuation, so two engines can be compared token by token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

from loadgen.client import (
    MAX_BODY_BYTES,
    RequestSpec,
    Target,
)
from loadgen.engine_text import excerpt
from loadgen.logprobs import parse_logprobs
from loadgen.prompts import (
    synthetic_prompts,
)
from loadgen.schedule import (
    PlannedSize,
)
from loadgen.suite.knobs import check_knobs, replace_knobs
from loadgen.suite.wire import ProbeKind, api_url, client_for, failure_text, over_cap, post_capped
from loadgen.suite.workloads import BuiltScenario


@dataclass(frozen=True, slots=True)
class Correctness:
    """Greedy probes with logprobs: temperature 0, fixed seeds, top-5 logprobs and token ids,
    so that two engines serving the same weights can be compared token by token.

    ``teacher_forced``: also score the reference's greedy continuation with both engines
    through ``prompt_logprobs`` (:func:`score_continuations`), where the engines support it.
    ``envelope_load``: requests kept in flight on the reference while it repeats the probes
    all at once, so its envelope (the reference against itself) includes the batch noise a
    loaded engine has; 0 repeats them alone.
    """

    name: ClassVar[str] = "correctness"
    probes_count: int = 8
    prompt_tokens: int = 32
    max_tokens: int = 32
    top_logprobs: int = 5
    teacher_forced: bool = True
    envelope_load: int = 16
    # set by the gate (gate/runs/probes.py adapt_to) when both engines name tokens by id; never
    # a spec's: against an engine that answers text it would make every position differ
    tokens_by_id: bool = field(default=False, metadata={"knob": False})

    def __post_init__(self) -> None:
        check_knobs(self)

    def requests(self, seed: int = 0) -> list[RequestSpec]:
        prompts = synthetic_prompts(self.probes_count, self.prompt_tokens, seed=seed)
        return [
            RequestSpec(
                i,
                p,
                self.max_tokens,
                {
                    "temperature": 0.0,
                    "seed": seed + i,
                    "logprobs": self.top_logprobs,
                    "return_token_ids": True,
                    # vLLM then names the top-k by id, not by a text several tokens share
                    # (loadgen/logprobs.py); asked only when both engines do (tokens_by_id),
                    # since a text-keyed answer cannot be compared with an id-keyed one
                    **({"return_tokens_as_token_ids": True} if self.tokens_by_id else {}),
                    "ignore_eos": True,
                },
            )
            for i, p in enumerate(prompts)
        ]

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        me = replace_knobs(self, overrides)
        return BuiltScenario(me.name, me.requests(seed), concurrency=1)

    def plan(self, **overrides: Any) -> PlannedSize:
        """``probes_count`` greedy probes (the knobs were checked when the entry was made)."""
        me: Correctness = replace_knobs(self, overrides)
        return PlannedSize(me.probes_count, None, exact=True)


# --------------------------------------------------------------------------- correctness


@dataclass(slots=True)
class CorrectnessResult:
    """One greedy probe's output, token by token, for comparing engines.

    ``tokens`` are the sampled tokens as the logprobs name them (the keys of
    ``top_logprobs``); ``prompt_token_ids`` come with ``return_token_ids`` where the engine
    gives them. A logprob the engine sent as ``null`` (vLLM's NaN) is NaN here.
    """

    request_id: int
    prompt: str
    status: int | None
    token_ids: list[int] | None
    logprobs: list[float] | None
    top_logprobs: list[dict[str, float]] | None
    text: str
    error: str | None = None
    tokens: list[str] | None = None
    prompt_token_ids: list[int] | None = None
    top_logprobs_by_id: list[dict[int, float]] | None = None  # where entries name their ids
    completion_tokens: int | None = None  # the answer's usage, where it reports one

    @property
    def aligned(self) -> bool:
        """One logprob entry per generated token. llama.cpp merges tokens that end inside a
        UTF-8 character into one entry (its usage counts more tokens than there are
        entries), and then a position of one answer is not the same position of another."""
        return (
            self.completion_tokens is None
            or self.logprobs is None
            or len(self.logprobs) == self.completion_tokens
        )


async def _post_completion(
    http: httpx.AsyncClient,
    target: Target,
    body: dict[str, Any],
    result: CorrectnessResult | ScoreResult,
    cap: int = MAX_BODY_BYTES,
    api: ProbeKind = "completions",
) -> tuple[int | None, Any]:
    """POST a non-streaming completion (or chat completion), reading at most ``cap`` bytes of
    the answer; a transport failure, the deadline or a longer answer goes to `result.error`
    (and the status returned is None), else the status to `result.status` and it and the
    parsed body are returned."""
    url = api_url(target, api)
    try:
        status, payload, more = await post_capped(http, url, body, target, cap)
    except (httpx.HTTPError, TimeoutError) as exc:
        result.error = failure_text(exc, target)
        return None, None
    result.status = status
    if more:
        result.error = f"HTTP {status}: " + over_cap(cap, "its cap")
        return None, None
    return status, _json_or_text(payload)


def _json_or_text(payload: bytes) -> Any:
    """The body as JSON, or the start of its text when it is not JSON (an engine's plain 500
    page)."""
    try:
        return json.loads(payload)
    except ValueError:
        return payload[:2000].decode("utf-8", errors="replace")


def _logprob(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else float("nan")


async def run_correctness(
    target: Target,
    *,
    scenario: Correctness | None = None,
    seed: int = 0,
    client: httpx.AsyncClient | None = None,
    concurrent: bool = False,
    background: int = 0,
    api: ProbeKind = "completions",
) -> list[CorrectnessResult]:
    """Send the greedy probes (non-streaming completions, or chat with ``api="chat"`` for an
    engine without the completions API: the prompt as one user message, OpenAI's
    ``logprobs: true`` and ``top_logprobs``) and return what each produced.

    Non-streaming, so that the answer is one JSON document whose logprobs need no
    reassembly; ``return_token_ids`` is vLLM's (engines without it give ``token_ids=None``
    and the comparison falls back to the logprob tokens' text). One probe at a time, or with
    ``concurrent`` all at once, while ``background`` other requests are kept in flight (the
    batch an engine under load computes them in).
    """
    scenario = scenario or Correctness()
    requests = scenario.requests(seed)
    width = (len(requests) if concurrent else 1) + background
    async with (
        client_for(target, client, width) as http,
        _background_load(http, target, background, scenario, seed, api),
    ):
        if concurrent:
            return list(
                await asyncio.gather(*(_greedy_probe(http, target, r, api) for r in requests))
            )
        return [await _greedy_probe(http, target, r, api) for r in requests]


_GREEDY_SLACK_BYTES = 1 << 20


def _greedy_body(target: Target, req: RequestSpec, api: ProbeKind) -> dict[str, Any]:
    body: dict[str, Any] = {"model": target.model, "max_tokens": req.max_tokens}
    body.update(req.extra)
    if api == "chat":
        body["messages"] = [{"role": "user", "content": req.prompt}]
        k = body.pop("logprobs", None)
        if isinstance(k, int) and not isinstance(k, bool):
            body["logprobs"], body["top_logprobs"] = True, k
    else:
        body["prompt"] = req.prompt
    body["stream"] = False
    return body


async def _greedy_probe(
    http: httpx.AsyncClient, target: Target, req: RequestSpec, api: ProbeKind = "completions"
) -> CorrectnessResult:
    body = _greedy_body(target, req, api)
    result = CorrectnessResult(req.request_id, req.prompt, None, None, None, None, "")
    # The answer is its tokens with their top-k and the prompt's ids: its size follows from
    # the request, so an engine that sends more is stopped early (1 MiB of slack, as a
    # streamed line gets).
    k = req.extra.get("logprobs")
    top = k if isinstance(k, int) and not isinstance(k, bool) else 0
    cap = _GREEDY_SLACK_BYTES + (req.max_tokens * (top + 1) + len(req.prompt)) * (
        _SCORE_BYTES_PER_ENTRY
    )
    status, obj = await _post_completion(
        http, target, body, result, min(cap, MAX_BODY_BYTES), api=api
    )
    if status is None:
        return result
    choice = (obj.get("choices") or [None])[0] if isinstance(obj, dict) else None
    if status != 200 or not isinstance(choice, dict):
        result.error = f"HTTP {status}: {excerpt(str(obj))}"
        return result
    message = choice.get("message")
    if api == "chat" and isinstance(message, dict):
        content = message.get("content")
        result.text = content if isinstance(content, str) else ""
    else:
        result.text = choice.get("text") or ""
    ids = choice.get("token_ids")
    result.token_ids = [int(i) for i in ids] if isinstance(ids, list) else None
    prompt_ids = choice.get("prompt_token_ids")
    if isinstance(prompt_ids, list) and all(isinstance(i, int) for i in prompt_ids):
        result.prompt_token_ids = [int(i) for i in prompt_ids]
    # vLLM's tokens/token_logprobs lists or the chat-style content list (loadgen/logprobs.py)
    parsed = parse_logprobs(choice.get("logprobs"))
    if parsed is not None:
        result.logprobs = parsed.logprobs
        result.tokens = parsed.tokens or None
        result.top_logprobs = parsed.top or None
        if result.token_ids is None and parsed.ids is not None:
            result.token_ids = parsed.ids  # the ids inside the entries (llama.cpp)
        result.top_logprobs_by_id = parsed.top_ids
    usage = obj.get("usage") if isinstance(obj, dict) else None
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(count, int) and not isinstance(count, bool):
        result.completion_tokens = count
    return result


@contextlib.asynccontextmanager
async def _background_load(
    http: httpx.AsyncClient,
    target: Target,
    n: int,
    scenario: Correctness,
    seed: int,
    api: ProbeKind = "completions",
) -> AsyncIterator[None]:
    """Keep ``n`` generation requests in flight on ``target`` until the block ends."""
    if n <= 0:
        yield
        return
    prompts = synthetic_prompts(n, scenario.prompt_tokens, seed=seed + 104_729)
    url = api_url(target, api)
    background_cap = _GREEDY_SLACK_BYTES + scenario.max_tokens * _SCORE_BYTES_PER_ENTRY

    async def loop(prompt: str) -> None:
        body: dict[str, Any] = {
            "model": target.model,
            "max_tokens": scenario.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": False,
        }
        if api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        while True:
            try:
                await post_capped(http, url, body, target, background_cap)
            except (httpx.HTTPError, TimeoutError):
                await asyncio.sleep(0.05)  # a refusing engine is not ours to hammer

    tasks = [asyncio.create_task(loop(p)) for p in prompts]
    try:
        await asyncio.sleep(0)  # let the background requests leave first
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(slots=True)
class ScoreResult:
    """One engine's teacher-forced scores of a continuation: per continuation token, its
    logprob and the engine's top-k {token id: logprob}.

    ``supported`` is False when the engine does not do ``prompt_logprobs`` (it refused the
    option or ignored it), as opposed to an engine that failed the request (``error``).
    """

    request_id: int
    status: int | None
    logprobs: list[float] | None = None
    top: list[dict[int, float]] | None = None
    error: str | None = None
    supported: bool = True


_SCORE_BYTES_PER_ENTRY = 256
"""Room per prompt token and top-k entry in a teacher-forced answer (vLLM writes about 60
bytes: ``"123": {"logprob": -1.23, "rank": 1, "decoded_token": "abc"}``)."""


async def score_continuations(
    target: Target,
    items: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    top_logprobs: int = 5,
    client: httpx.AsyncClient | None = None,
    concurrent: bool = False,
    background: int = 0,
    scenario: Correctness | None = None,
    seed: int = 0,
) -> list[ScoreResult]:
    """Teacher-forced scoring: for each (prompt token ids, continuation token ids), send the
    concatenation as a token-id prompt with vLLM's ``prompt_logprobs`` and read back the
    logprob and top-k of every continuation token. One at a time, or all at once beside
    ``background`` other requests (as :func:`run_correctness`)."""
    scenario = scenario or Correctness()
    width = (len(items) if concurrent else 1) + background
    async with (
        client_for(target, client, width) as http,
        _background_load(http, target, background, scenario, seed),
    ):
        jobs = [(i, list(p), list(c)) for i, (p, c) in enumerate(items)]
        if concurrent:
            return list(
                await asyncio.gather(*(_score(http, target, *j, top_logprobs) for j in jobs))
            )
        return [await _score(http, target, *j, top_logprobs) for j in jobs]


async def _score(
    http: httpx.AsyncClient,
    target: Target,
    request_id: int,
    prompt: list[int],
    continuation: list[int],
    top_n: int,
) -> ScoreResult:
    body = {
        "model": target.model,
        "prompt": prompt + continuation,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": top_n,
        "stream": False,
    }
    result = ScoreResult(request_id, None)
    # The answer scores every prompt token: its size grows with the prompt and the top-k.
    scored = len(prompt) + len(continuation)
    cap = _GREEDY_SLACK_BYTES + scored * (top_n + 1) * _SCORE_BYTES_PER_ENTRY
    status, obj = await _post_completion(http, target, body, result, cap)
    if status is None:
        return result
    if status != 200 or not isinstance(obj, dict):
        result.error = f"HTTP {status}: {excerpt(str(obj))}"
        # A clean 400 naming the option is an engine without it, not a broken engine.
        result.supported = not (status == 400 and "prompt_logprobs" in json.dumps(obj)[:2000])
        return result
    choice = (obj.get("choices") or [None])[0]
    entries = choice.get("prompt_logprobs") if isinstance(choice, dict) else None
    if entries is None:
        entries = obj.get("prompt_logprobs")  # chat puts it beside the choices
    if not isinstance(entries, list):
        result.supported = False
        result.error = "no prompt_logprobs in the response"
        return result
    if len(entries) != len(prompt) + len(continuation):
        result.error = (
            f"{len(entries)} prompt_logprobs entries for {len(prompt) + len(continuation)} "
            "prompt tokens"
        )
        return result
    logprobs: list[float] = []
    top: list[dict[int, float]] = []
    for token, entry in zip(continuation, entries[len(prompt) :], strict=True):
        if not isinstance(entry, dict) or not isinstance(entry.get(str(token)), dict):
            result.error = f"prompt_logprobs lacks the scored token {token}"
            return result
        logprobs.append(_logprob(entry[str(token)].get("logprob")))
        ranked: dict[int, float] = {}
        for key, value in entry.items():
            rank = value.get("rank") if isinstance(value, dict) else None
            if isinstance(rank, int) and rank <= top_n and str(key).lstrip("-").isdigit():
                ranked[int(key)] = _logprob(value.get("logprob"))
        top.append(ranked)
    result.logprobs, result.top = logprobs, top
    return result


def first_divergence(a: CorrectnessResult, b: CorrectnessResult) -> int | None:
    """Index of the first output token where two engines differ; ``None`` if they agree."""
    left = a.token_ids if a.token_ids is not None else a.text.split()
    right = b.token_ids if b.token_ids is not None else b.text.split()
    for i, (x, y) in enumerate(zip(left, right, strict=False)):
        if x != y:
            return i
    return None if len(left) == len(right) else min(len(left), len(right))
