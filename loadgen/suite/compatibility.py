"""The compatibility suite: a fixed set of request shapes sent one at a time, each answer
checked against the OpenAI schema (:mod:`loadgen.suite.schema`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from loadgen.client import (
    IDENTITY_HEADERS,
    MAX_BODY_BYTES,
    RequestSpec,
    Target,
    read_capped,
)
from loadgen.prompts import (
    synthetic_prompts,
)
from loadgen.schedule import (
    PlannedSize,
)
from loadgen.suite.knobs import check_knobs, replace_knobs
from loadgen.suite.schema import check_body, check_error, check_stream
from loadgen.suite.wire import ProbeKind, api_url, client_for, failure_text, over_cap, post_capped
from loadgen.suite.workloads import BuiltScenario


@dataclass(frozen=True, slots=True)
class Probe:
    """One request shape. ``body`` is merged over the model and ``messages``/``prompt``;
    ``accept`` lists the statuses that count as a correct answer (a clean 400 for a request
    beyond the context is correct)."""

    name: str
    api: ProbeKind
    body: Mapping[str, Any]
    stream: bool = False
    accept: tuple[int, ...] = (200,)
    prompt: str = "The quick brown fox jumps over the lazy dog."


@dataclass(slots=True)
class ProbeResult:
    """What one probe got back: ``ok`` is an accepted status with a well-formed body."""

    name: str
    api: ProbeKind
    stream: bool
    status: int | None
    well_formed: bool
    problems: list[str]
    elapsed_ms: float
    accepted: bool = False

    @property
    def ok(self) -> bool:
        return self.accepted and self.well_formed


_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def default_probes(max_model_len: int | None = None) -> list[Probe]:
    """The fixed compatibility set; the long-prompt probe needs the context length."""
    probes = [
        Probe("completions", "completions", {"max_tokens": 8}),
        Probe("completions_stream", "completions", {"max_tokens": 8}, stream=True),
        Probe("chat", "chat", {"max_tokens": 8}),
        Probe("chat_stream", "chat", {"max_tokens": 8}, stream=True),
        Probe(
            "stream_usage",
            "chat",
            {"max_tokens": 8, "stream_options": {"include_usage": True}},
            stream=True,
        ),
        Probe("stop_sequence", "completions", {"max_tokens": 32, "stop": [" the", "\n"]}),
        Probe("max_tokens_1", "completions", {"max_tokens": 1}),
        Probe("max_tokens_1_stream", "chat", {"max_tokens": 1}, stream=True),
        Probe("max_tokens_large", "completions", {"max_tokens": 1 << 20}, accept=(200, 400)),
        Probe("logprobs", "completions", {"max_tokens": 8, "logprobs": 5}),
        Probe("chat_logprobs", "chat", {"max_tokens": 8, "logprobs": True, "top_logprobs": 5}),
        Probe("seed", "completions", {"max_tokens": 8, "seed": 1234, "temperature": 0.8}),
        Probe(
            "unicode",
            "chat",
            {"max_tokens": 8},
            prompt="Ünïcödé ✓ — 中文 テスト 😀 עברית\u200b end",
        ),
        Probe(
            "json_format",
            "chat",
            {"max_tokens": 16, "response_format": {"type": "json_object"}},
            prompt="Reply with a JSON object with a key 'ok'.",
        ),
        Probe(
            "tool_call",
            "chat",
            {"max_tokens": 32, "tools": [_TOOL], "tool_choice": "auto"},
            prompt="What is the weather in Paris?",
        ),
    ]
    if max_model_len is not None and max_model_len > 16:
        words = synthetic_prompts(1, max(1, max_model_len - 16), seed=7)[0]
        probes.append(
            Probe("long_prompt", "completions", {"max_tokens": 4}, accept=(200, 400), prompt=words)
        )
        over = synthetic_prompts(1, max_model_len + 8, seed=8)[0]
        probes.append(
            Probe("over_context", "completions", {"max_tokens": 4}, accept=(400,), prompt=over)
        )
    return probes


@dataclass(frozen=True, slots=True)
class Compatibility:
    """A fixed probe set of request shapes; run it with :func:`run_probes`.

    ``build`` gives the streaming probes as ordinary requests (one at a time), so the shapes
    can also ride along in a load run; the full check, including non-streaming shapes and
    schema validation, is :func:`run_probes`.
    """

    name: ClassVar[str] = "compatibility"
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        check_knobs(self)

    def probes(self) -> list[Probe]:
        return default_probes(self.max_model_len)

    def plan(self, **overrides: Any) -> PlannedSize:
        """What ``build`` gives: the streaming completions probes, whatever the context length
        (the long-prompt probes are not streamed), without building the long prompts."""
        replace_knobs(self, overrides)
        shapes = default_probes(None)
        count = sum(1 for p in shapes if p.stream and p.api == "completions")
        return PlannedSize(count, None, exact=True)

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        me = replace_knobs(self, overrides)
        reqs = [
            RequestSpec(i, p.prompt, int(p.body.get("max_tokens", 16)), _extra(p.body))
            for i, p in enumerate(x for x in me.probes() if x.stream and x.api == "completions")
        ]
        return BuiltScenario(me.name, reqs, concurrency=1)


def _extra(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "max_tokens"}


# --------------------------------------------------------------------------- probe runners


# The longest context the default probes are sized to (the gate passes its operator's
# prompt cap): prompts of about 110 bytes a token are built and held for the probe.
MAX_PROBE_CONTEXT = 32_768


async def run_probes(
    target: Target,
    probes: Sequence[Probe] | None = None,
    *,
    client: httpx.AsyncClient | None = None,
    max_context: int = MAX_PROBE_CONTEXT,
) -> list[ProbeResult]:
    """Send every probe (one at a time) and check each answer against the OpenAI schema.

    ``target.api`` is ignored: each probe names its own API. Without ``probes`` the default
    set is used, sized to the context length the engine reports in ``/v1/models`` (vLLM's
    ``max_model_len``) when it reports one, up to ``max_context`` tokens: an engine that
    reports more (a real 1M context, or a hostile answer) gets no long-prompt probes, as one
    that reports none, instead of prompts the gate would build and hold in memory. Never
    raises for an engine's answer: a refused connection is a probe result with status ``None``.
    """
    async with client_for(target, client) as http:
        if probes is None:
            reported = await _max_model_len(http, target)
            if reported is not None and reported > max_context:
                reported = None
            probes = default_probes(reported)
        return [await _probe(http, target, p) for p in probes]


async def _probe(http: httpx.AsyncClient, target: Target, probe: Probe) -> ProbeResult:
    body: dict[str, Any] = {"model": target.model}
    if probe.api == "chat":
        body["messages"] = [{"role": "user", "content": probe.prompt}]
    else:
        body["prompt"] = probe.prompt
    body.update(probe.body)
    body["stream"] = probe.stream
    url = api_url(target, probe.api)
    start = time.monotonic_ns()
    result = ProbeResult(probe.name, probe.api, probe.stream, None, False, [], 0.0)
    try:
        status, payload, more = await post_capped(http, url, body, target, MAX_BODY_BYTES)
    except (httpx.HTTPError, TimeoutError) as exc:
        result.problems.append(failure_text(exc, target))
        result.elapsed_ms = (time.monotonic_ns() - start) / 1e6
        return result
    result.status = status
    result.elapsed_ms = (time.monotonic_ns() - start) / 1e6
    result.accepted = status in probe.accept
    if more:
        result.problems.append(over_cap(MAX_BODY_BYTES, "MAX_BODY_BYTES"))
    elif status != 200:
        result.problems.extend(check_error(payload))
    elif probe.stream:
        result.problems.extend(check_stream(payload, probe.api, probe.body))
    else:
        result.problems.extend(check_body(payload, probe.api, probe.body))
    result.well_formed = not result.problems
    if not result.accepted:
        result.problems.insert(0, f"status {status} not in {list(probe.accept)}")
    return result


MAX_MODELS_BODY_BYTES = 64 << 10
"""The most of ``/v1/models`` that is read (64 KiB, as the gate's readiness check reads):
vLLM's and SGLang's lists are a few hundred bytes a model."""


async def _max_model_len(http: httpx.AsyncClient, target: Target) -> int | None:
    """The context length ``/v1/models`` reports for the target's model; None when it reports
    none, fails, or answers more than :data:`MAX_MODELS_BODY_BYTES` (the long-prompt probes
    are then left out, as for an engine that does not say its context length)."""
    base = target.base_url.rstrip("/")
    url = (base if base.endswith("/v1") else base + "/v1") + "/models"
    try:
        async with (
            asyncio.timeout(target.deadline_s),
            http.stream("GET", url, headers=IDENTITY_HEADERS, timeout=target.timeout_s) as response,
        ):
            payload, more = await read_capped(response, MAX_MODELS_BODY_BYTES)
        if more:
            return None
        data = json.loads(payload)
        for card in data.get("data", []):
            if card.get("id") == target.model and isinstance(card.get("max_model_len"), int):
                return int(card["max_model_len"])
    except (httpx.HTTPError, TimeoutError, ValueError, AttributeError, TypeError):
        return None
    return None
