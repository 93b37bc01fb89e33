"""The built-in scenario suite: named, typed, tunable workloads, and the probe runners.

Each entry is a frozen dataclass whose fields are its knobs with defaults; ``build(seed,
**overrides)`` returns a :class:`BuiltScenario` (requests plus either open-loop offsets or a
closed-loop concurrency, and the phases of a phased scenario). Overrides are field names, so
a gate spec entry such as ``{suite: peak, rate: 40}`` maps onto ``get("peak").build(seed,
rate=40)`` one to one, and a misspelt knob is an error naming the scenario's real knobs.

``plan(**overrides)`` checks the knobs as ``build`` would (the same errors, in the same order)
and returns the entry's :class:`~loadgen.schedule.PlannedSize` by arithmetic, in constant
time: a service validates and caps a caller's spec without building a schedule of a hundred
thousand requests inside the request that sent it.

Knobs are a caller's, so each is checked by type and bound whenever an entry is made
(:data:`RULES`, :func:`knob_problems`): real numbers, finite and bounded, ints for counts, and
an ``extra`` of allow-listed sampling parameters only (:data:`EXTRA_ALLOWED`; never the model,
the prompt, the stream, the output length or the fan-out, :data:`EXTRA_REFUSED`).

- ``normal``: steady Poisson at a nominal rate;
- ``peak``: the same at a higher sustained rate;
- ``overload``: nominal, then well beyond capacity, then nominal again;
- ``recovery``: the same shape, with the phase after the overload marked ``recovery`` so its
  latency can be compared with the ``baseline`` phase before it (how fast does it return?);
- ``compatibility``: a fixed set of request shapes; :func:`run_probes` sends each and checks
  the answer against the OpenAI schema;
- ``correctness``: greedy probes with logprobs; :func:`run_correctness` returns per-probe
  token ids and logprobs for divergence checks between two engines.

The runners read every answer with a cap (:data:`~loadgen.client.MAX_BODY_BYTES`, and
:data:`MAX_MODELS_BODY_BYTES` for the model list) and end every request at the target's
``deadline_s``: an engine under test cannot make them read or wait without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import reprlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import httpx
import numpy as np
import numpy.typing as npt

from loadgen.client import (
    IDENTITY_HEADERS,
    MAX_BODY_BYTES,
    RequestSpec,
    Target,
    excerpt,
    make_client,
    read_capped,
)
from loadgen.logprobs import parse_logprobs
from loadgen.prompts import (
    LengthDist,
    check_synthetic_prompts,
    sample_lengths,
    synthetic_prompts,
    varied_prompts,
)
from loadgen.schedule import (
    ARRIVALS,
    MAX_REQUESTS,
    Arrival,
    Phase,
    PhasedSchedule,
    PlannedSize,
    build_offsets,
    build_phased,
    plan_offsets,
    plan_phased,
)

# --------------------------------------------------------------------------- load scenarios


@dataclass(frozen=True, slots=True)
class BuiltScenario:
    """What a runner needs: exactly one of ``offsets_s`` and ``concurrency`` is set."""

    name: str
    requests: list[RequestSpec]
    offsets_s: npt.NDArray[np.float64] | None = None
    concurrency: int | None = None
    phases: PhasedSchedule | None = None


def _requests(
    n: int,
    prompt_tokens: int | LengthDist,
    max_tokens: int | LengthDist,
    extra: Mapping[str, Any],
    seed: int,
) -> list[RequestSpec]:
    if isinstance(prompt_tokens, LengthDist):
        prompts = varied_prompts(n, prompt_tokens, seed=seed)
    else:
        prompts = synthetic_prompts(n, prompt_tokens, seed=seed)
    if isinstance(max_tokens, LengthDist):
        outs = sample_lengths(n, max_tokens, seed=seed + 1)
    else:
        outs = [max_tokens] * n
    return [RequestSpec(i, p, outs[i], dict(extra)) for i, p in enumerate(prompts)]


def _check_requests(n: int, prompt_tokens: int | LengthDist) -> None:
    """Raise what :func:`_requests` would raise for ``n`` requests, without building them (the
    knobs' types and bounds were checked when the entry was made)."""
    if not isinstance(prompt_tokens, LengthDist):
        check_synthetic_prompts(n, prompt_tokens)


_DEFAULT_EXTRA: Mapping[str, Any] = {"ignore_eos": True, "temperature": 0.0}


# --------------------------------------------------------------------------- knob checks
#
# A suite entry's knobs come from a caller's spec (`{suite: normal, rate: 40}`), so each is
# checked by an allow-list of types and bounds when the entry is made (``__post_init__``, which
# ``get``, ``build`` and ``plan`` all pass through): numbers are real ints or floats, never
# strings or booleans, and finite; counts are ints; ``extra`` holds only sampling parameters
# that leave what is measured within the operator's caps. :func:`knob_problems` names every
# bad knob at once (the spec's validation); an entry refuses the first with a
# :class:`KnobError`.

MAX_RATE = 100_000.0
"""The largest rate knob (requests/s), as an explicit scenario's; the operator caps lower."""
MAX_SECONDS = 86_400.0
"""The longest duration knob (a day), as an explicit scenario's ``duration_s``."""
MAX_LENGTH = 1_000_000
"""The largest ``prompt_tokens``/``max_tokens`` knob, as an explicit scenario's."""
MAX_MODEL_LEN = 10_000_000
"""The largest context length a compatibility suite may be told."""
MIN_BURSTINESS, MAX_BURSTINESS = 0.05, 1_000.0
"""Gamma shapes: below 0.05 nearly every request of a run lands in one instant."""
MAX_SLO_MS = 3_600_000.0
"""The longest latency objective (an hour)."""
MAX_SETTINGS_DEPTH = 4
"""Levels of objects and lists in a suite scenario's ``settings``, the settings themselves
counted: ``settings.extra.stop`` is 3."""

MAX_EXTRA_STRING = 100
"""The longest string in ``extra`` (a stop sequence)."""
MAX_STOP_SEQUENCES = 8
MAX_LOGPROBS = 20

EXTRA_REFUSED: Mapping[str, str] = {
    "model": "the gate sends the spec's model",
    "prompt": "the gate makes the prompts (prompt_tokens sets their length)",
    "messages": "the gate makes the prompts (prompt_tokens sets their length)",
    "stream": "the gate streams every request",
    "stream_options": "the gate asks for the usage it measures itself",
    "max_tokens": "the output length is the max_tokens setting, which is capped",
    "max_completion_tokens": "the output length is the max_tokens setting, which is capped",
    "min_tokens": "output the caps do not count; use max_tokens with ignore_eos",
    "n": "more than one completion per request: the gate sends and judges one",
    "best_of": "more than one completion per request: the gate sends and judges one",
    "use_beam_search": "more than one completion per request: the gate sends and judges one",
    "prompt_logprobs": "scores every prompt token: work the caps do not count",
}
"""Keys ``extra`` may not carry, each with why (the rest not allowed are simply unknown)."""

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlevel = 2
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 4


def _said(value: Any) -> str:
    """A value as a message quotes it: short, whatever it is (a 100k-character string, an
    integer of 5000 digits, a list nested 300 deep)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    try:
        return _repr.repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"


def _g(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _real(
    value: Any, low: float, high: float, *, above: bool = False, unit: str = ""
) -> str | None:
    """Why ``value`` is not a real number in ``[low, high]`` (``(low, high]`` when ``above``);
    None when it is. An integer too large for a float is past ``high``, not an error."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {_said(value)}"
    try:
        x = float(value)
    except OverflowError:
        x = math.inf if value > 0 else -math.inf
    if math.isnan(x) or x < low or (above and x == low):
        return f"must be a finite number {'>' if above else '>='} {_g(low)}, got {_said(value)}"
    if x > high:
        return f"must be at most {_g(high)}{unit}, got {_said(value)}"
    return None


def _integer(value: Any, low: int, high: int, what: str = "") -> str | None:
    """Why ``value`` is not an int in ``[low, high]``; None when it is."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"must be an integer from {low} to {high}{what}, got {_said(value)}"
    return None


def _length(value: Any) -> str | None:
    """A token count: an int, or (from Python) a :class:`LengthDist` within the same bounds."""
    if isinstance(value, LengthDist):
        top = value.maximum
        if isinstance(top, bool) or not isinstance(top, int) or top > MAX_LENGTH:
            return f"a length distribution's maximum must be an integer <= {MAX_LENGTH}"
        return None
    return _integer(value, 1, MAX_LENGTH, " (or a length distribution)")


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda value: None if value is None else check(value)


def _arrival(value: Any) -> str | None:
    if not isinstance(value, str) or value not in ARRIVALS:
        return f"must be one of {', '.join(ARRIVALS)}, got {_said(value)}"
    return None


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {_said(value)}"


def _stop(value: Any) -> str | None:
    short = f"a string of at most {MAX_EXTRA_STRING} characters"
    if isinstance(value, str):
        return None if len(value) <= MAX_EXTRA_STRING else f"must be {short}"
    if (
        isinstance(value, list)
        and len(value) <= MAX_STOP_SEQUENCES
        and all(isinstance(v, str) and len(v) <= MAX_EXTRA_STRING for v in value)
    ):
        return None
    return f"must be {short} or a list of at most {MAX_STOP_SEQUENCES} such strings"


def _logprobs(value: Any) -> str | None:
    if isinstance(value, bool):  # the chat API's form: true with top_logprobs
        return None
    return _integer(value, 0, MAX_LOGPROBS, " (or true/false)")


def _template_kwargs(value: Any) -> str | None:
    """vLLM's and SGLang's `chat_template_kwargs` (e.g. `{enable_thinking: false}`): a few
    named flags of simple values, for the chat template, never the request's size."""
    rule = (
        f"must be an object of at most 8 names (letters, digits, '_') with true/false, finite "
        f"numbers or strings of at most {MAX_EXTRA_STRING} characters"
    )
    if not isinstance(value, Mapping) or len(value) > 8:
        return rule
    for k, v in value.items():
        if not (isinstance(k, str) and k.isidentifier() and len(k) <= 40):
            return rule
        simple = isinstance(v, bool) or (isinstance(v, str) and len(v) <= MAX_EXTRA_STRING)
        if not simple and not (isinstance(v, int | float) and _real(v, -1e9, 1e9) is None):
            return rule
    return None


EXTRA_ALLOWED: Mapping[str, Callable[[Any], str | None]] = {
    "temperature": lambda v: _real(v, 0.0, 2.0),
    "top_p": lambda v: _real(v, 0.0, 1.0, above=True),
    "top_k": lambda v: _integer(v, -1, 100_000),
    "min_p": lambda v: _real(v, 0.0, 1.0),
    "seed": lambda v: _integer(v, -(2**63), 2**63 - 1),
    "stop": _stop,
    "ignore_eos": _boolean,
    "repetition_penalty": lambda v: _real(v, 0.0, 2.0, above=True),
    "presence_penalty": lambda v: _real(v, -2.0, 2.0),
    "frequency_penalty": lambda v: _real(v, -2.0, 2.0),
    "logprobs": _logprobs,
    "top_logprobs": lambda v: _integer(v, 0, MAX_LOGPROBS),
    "skip_special_tokens": _boolean,
    "chat_template_kwargs": _template_kwargs,
}
"""The sampling parameters ``extra`` may carry, each with its check: none of them changes
how many requests, prompt tokens or output tokens a scenario asks for."""


def _key(key: str) -> str:
    return key if len(key) <= 40 else key[:40] + "…"


def _extra_rule(knob: str, value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, Mapping):
        return [
            (
                knob,
                "must be an object of sampling parameters "
                f"({', '.join(EXTRA_ALLOWED)}), got {_said(value)}",
            )
        ]
    out: list[tuple[str, str]] = []
    for key, v in value.items():
        if not isinstance(key, str):
            out.append((knob, f"keys must be strings, got {_said(key)}"))
            continue
        path = f"{knob}.{_key(key)}"
        check = EXTRA_ALLOWED.get(key)
        if key in EXTRA_REFUSED:
            out.append((path, f"not allowed: {EXTRA_REFUSED[key]}"))
        elif check is None:
            out.append(
                (path, f"not an allowed sampling parameter (allowed: {', '.join(EXTRA_ALLOWED)})")
            )
        elif (why := check(v)) is not None:
            out.append((path, why))
    return out


Rule = Callable[[str, Any], list[tuple[str, str]]]


def _one(check: Callable[[Any], str | None]) -> Rule:
    def rule(knob: str, value: Any) -> list[tuple[str, str]]:
        why = check(value)
        return [] if why is None else [(knob, why)]

    return rule


def _rate(low_open: bool) -> Rule:
    return _one(lambda v: _real(v, 0.0, MAX_RATE, above=low_open, unit=" requests/s"))


def _seconds(low_open: bool) -> Rule:
    return _one(lambda v: _real(v, 0.0, MAX_SECONDS, above=low_open, unit=" s"))


_LOAD_RULES: dict[str, Rule] = {
    "arrival": _one(_arrival),
    "prompt_tokens": _one(_length),
    "max_tokens": _one(_length),
    "extra": _extra_rule,
}
_STEADY_RULES: dict[str, Rule] = {
    "rate": _rate(True),
    "requests": _one(_optional(lambda v: _integer(v, 1, MAX_REQUESTS))),
    "duration_s": _one(_optional(lambda v: _real(v, 0.0, MAX_SECONDS, above=True, unit=" s"))),
    "burstiness": _one(lambda v: _real(v, MIN_BURSTINESS, MAX_BURSTINESS)),
    **_LOAD_RULES,
}
_SLO = _one(_optional(lambda v: _real(v, 0.0, MAX_SLO_MS, above=True, unit=" ms")))
_PHASED_RULES: dict[str, Rule] = {
    "rate": _rate(False),  # a phase may idle at 0
    "overload_rate": _rate(False),
    "before_s": _seconds(True),
    "overload_s": _seconds(True),
    "after_s": _seconds(True),
    "ramp_s": _seconds(False),
    **_LOAD_RULES,
}
RULES: Mapping[str, Mapping[str, Rule]] = {
    "normal": _STEADY_RULES,
    "peak": {**_STEADY_RULES, "slo_ttft_ms": _SLO, "slo_itl_ms": _SLO, "slo_e2e_ms": _SLO},
    "overload": _PHASED_RULES,
    "recovery": _PHASED_RULES,
    "compatibility": {"max_model_len": _one(_optional(lambda v: _integer(v, 1, MAX_MODEL_LEN)))},
    "correctness": {
        "probes_count": _one(lambda v: _integer(v, 1, 10_000)),
        "prompt_tokens": _one(lambda v: _integer(v, 1, MAX_LENGTH)),
        "max_tokens": _one(lambda v: _integer(v, 1, MAX_LENGTH)),
        "top_logprobs": _one(lambda v: _integer(v, 1, MAX_LOGPROBS)),
        "teacher_forced": _one(_boolean),
        "envelope_load": _one(lambda v: _integer(v, 0, 4_096)),
    },
}
"""Every knob of every entry, with its check (a test holds this to the dataclasses' fields)."""


class KnobError(ValueError):
    """A knob's value refused; ``knob`` names it (``extra.n`` for a key of ``extra``)."""

    def __init__(self, knob: str, reason: str) -> None:
        super().__init__(f"{knob}: {reason}")
        self.knob = knob
        self.reason = reason


def nesting_depth(value: Any, limit: int) -> int:
    """Levels of mappings and lists in ``value`` (a scalar is 0), counted without recursion
    and only up to ``limit + 1``: an answer above ``limit`` means "too deep"."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def knob_problems(name: str, knobs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(knob, why) for every value of ``knobs`` that entry ``name`` refuses by type or bound,
    in the order given; knobs the entry does not have are left to :func:`get` to name."""
    rules = RULES.get(name, {})
    out: list[tuple[str, str]] = []
    for knob, value in knobs.items():
        rule = rules.get(knob)
        if rule is not None:
            out += rule(knob, value)
    return out


def _check_knobs(entry: Any) -> None:
    """Refuse the first bad knob of a new entry (:func:`knob_problems`)."""
    values = {f.name: getattr(entry, f.name) for f in _knob_fields(entry)}
    problems = knob_problems(entry.name, values)
    if problems:
        raise KnobError(*problems[0])


@dataclass(frozen=True, slots=True)
class Steady:
    """Open loop at one rate for a number of requests (or a duration)."""

    name: ClassVar[str] = "normal"
    rate: float = 10.0
    requests: int | None = 300
    duration_s: float | None = None
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    prompt_tokens: int | LengthDist = 128
    max_tokens: int | LengthDist = 128
    extra: Mapping[str, Any] = field(default_factory=lambda: dict(_DEFAULT_EXTRA))

    def __post_init__(self) -> None:
        _check_knobs(self)

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        me = _replace(self, overrides)
        if me.duration_s is not None:
            offsets = build_offsets(
                me.arrival, me.rate, duration_s=me.duration_s, burstiness=me.burstiness, seed=seed
            )
        else:
            offsets = build_offsets(
                me.arrival, me.rate, requests=me.requests, burstiness=me.burstiness, seed=seed
            )
        reqs = _requests(len(offsets), me.prompt_tokens, me.max_tokens, me.extra, seed)
        return BuiltScenario(me.name, reqs, offsets_s=offsets)

    def plan(self, **overrides: Any) -> PlannedSize:
        """The knobs checked as ``build`` checks them, and the size it will build (module
        docstring): ``requests``, or ``rate x duration_s`` when a duration is given."""
        me = _replace(self, overrides)
        if me.duration_s is not None:
            size = plan_offsets(
                me.arrival, me.rate, duration_s=me.duration_s, burstiness=me.burstiness
            )
        else:
            size = plan_offsets(me.arrival, me.rate, requests=me.requests, burstiness=me.burstiness)
        _check_requests(size.requests, me.prompt_tokens)
        return size


@dataclass(frozen=True, slots=True)
class Normal(Steady):
    """Steady Poisson at a nominal rate."""

    name: ClassVar[str] = "normal"


@dataclass(frozen=True, slots=True)
class Peak(Steady):
    """A higher sustained rate: the busiest hour, not a spike.

    ``slo_ttft_ms``, ``slo_itl_ms`` (mean per request) and ``slo_e2e_ms`` define goodput (a
    request that succeeded and met every SLO given); with none given, goodput is success.
    """

    name: ClassVar[str] = "peak"
    rate: float = 40.0
    requests: int | None = 1200
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    slo_e2e_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Overload:
    """Nominal load, then ``overload_rate`` (beyond capacity) for a while, then nominal."""

    name: ClassVar[str] = "overload"
    rate: float = 10.0
    overload_rate: float = 80.0
    before_s: float = 10.0
    overload_s: float = 15.0
    after_s: float = 20.0
    ramp_s: float = 0.0
    arrival: Arrival = "poisson"
    prompt_tokens: int | LengthDist = 128
    max_tokens: int | LengthDist = 128
    extra: Mapping[str, Any] = field(default_factory=lambda: dict(_DEFAULT_EXTRA))
    after_name: ClassVar[str] = "after"

    def __post_init__(self) -> None:
        _check_knobs(self)

    def phases(self) -> list[Phase]:
        out = [Phase("baseline", self.before_s, self.rate, arrival=self.arrival)]
        if self.ramp_s > 0:
            out.append(Phase("ramp", self.ramp_s, self.rate, self.overload_rate, self.arrival))
        out.append(Phase("overload", self.overload_s, self.overload_rate, arrival=self.arrival))
        out.append(Phase(self.after_name, self.after_s, self.rate, arrival=self.arrival))
        return out

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        me = _replace(self, overrides)
        schedule = build_phased(me.phases(), seed=seed)
        reqs = _requests(len(schedule.offsets_s), me.prompt_tokens, me.max_tokens, me.extra, seed)
        return BuiltScenario(me.name, reqs, offsets_s=schedule.offsets_s, phases=schedule)

    def plan(self, **overrides: Any) -> PlannedSize:
        """The knobs checked as ``build`` checks them, and the size it will build (module
        docstring): the phases' expected requests, their durations summed."""
        me = _replace(self, overrides)
        size = plan_phased(me.phases())
        _check_requests(size.requests, me.prompt_tokens)
        return size


@dataclass(frozen=True, slots=True)
class Recovery(Overload):
    """Overload, then a marked ``recovery`` phase at the nominal rate: compare its latency
    over time with ``baseline`` to see how fast the engine drains its queue."""

    name: ClassVar[str] = "recovery"
    after_name: ClassVar[str] = "recovery"
    after_s: float = 30.0


# --------------------------------------------------------------------------- probes


ProbeKind = Literal["completions", "chat"]


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
        _check_knobs(self)

    def probes(self) -> list[Probe]:
        return default_probes(self.max_model_len)

    def plan(self, **overrides: Any) -> PlannedSize:
        """What ``build`` gives: the streaming completions probes, whatever the context length
        (the long-prompt probes are not streamed), without building the long prompts."""
        _replace(self, overrides)
        shapes = default_probes(None)
        count = sum(1 for p in shapes if p.stream and p.api == "completions")
        return PlannedSize(count, None, exact=True)

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        me = _replace(self, overrides)
        reqs = [
            RequestSpec(i, p.prompt, int(p.body.get("max_tokens", 16)), _extra(p.body))
            for i, p in enumerate(x for x in me.probes() if x.stream and x.api == "completions")
        ]
        return BuiltScenario(me.name, reqs, concurrency=1)


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
        _check_knobs(self)

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
        me = _replace(self, overrides)
        return BuiltScenario(me.name, me.requests(seed), concurrency=1)

    def plan(self, **overrides: Any) -> PlannedSize:
        """``probes_count`` greedy probes (the knobs were checked when the entry was made)."""
        me: Correctness = _replace(self, overrides)
        return PlannedSize(me.probes_count, None, exact=True)


Scenario = Normal | Peak | Overload | Recovery | Compatibility | Correctness

SUITE: dict[str, Callable[[], Scenario]] = {
    "normal": Normal,
    "peak": Peak,
    "overload": Overload,
    "recovery": Recovery,
    "compatibility": Compatibility,
    "correctness": Correctness,
}


def get(name: str, **overrides: Any) -> Scenario:
    """The suite entry ``name`` with its defaults replaced by ``overrides``."""
    if name not in SUITE:
        raise ValueError(f"scenario: unknown {name!r} (choose from {', '.join(SUITE)})")
    scenario: Scenario = _replace(SUITE[name](), overrides)
    return scenario


def _knob_fields(entry: Any) -> list[dataclasses.Field[Any]]:
    """An entry's fields a spec may set: all but those the gate sets itself (`knob: False`)."""
    return [f for f in dataclasses.fields(entry) if f.metadata.get("knob", True)]


def knobs(name: str) -> list[str]:
    """The overridable fields of a suite entry, for help texts and spec validation."""
    return [f.name for f in _knob_fields(get(name))]


def _replace(obj: Any, overrides: Mapping[str, Any]) -> Any:
    if not overrides:
        return obj
    names = {f.name for f in _knob_fields(obj)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        known = ", ".join(sorted(names))
        raise ValueError(f"{obj.name}: unknown setting(s) {', '.join(unknown)} (known: {known})")
    return dataclasses.replace(obj, **overrides)


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
    async with _client_for(target, client) as http:
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
    url = _api_url(target, probe.api)
    start = time.monotonic_ns()
    result = ProbeResult(probe.name, probe.api, probe.stream, None, False, [], 0.0)
    try:
        status, payload, more = await _post_capped(http, url, body, target, MAX_BODY_BYTES)
    except (httpx.HTTPError, TimeoutError) as exc:
        result.problems.append(_failure(exc, target))
        result.elapsed_ms = (time.monotonic_ns() - start) / 1e6
        return result
    result.status = status
    result.elapsed_ms = (time.monotonic_ns() - start) / 1e6
    result.accepted = status in probe.accept
    if more:
        result.problems.append(_over(MAX_BODY_BYTES, "MAX_BODY_BYTES"))
    elif status != 200:
        result.problems.extend(_check_error(payload))
    elif probe.stream:
        result.problems.extend(_check_stream(payload, probe.api, probe.body))
    else:
        result.problems.extend(_check_body(payload, probe.api, probe.body))
    result.well_formed = not result.problems
    if not result.accepted:
        result.problems.insert(0, f"status {status} not in {list(probe.accept)}")
    return result


async def _post_capped(
    http: httpx.AsyncClient, url: str, body: Mapping[str, Any], target: Target, cap: int
) -> tuple[int, bytes, bool]:
    """POST ``body``; the status, at most ``cap`` bytes of the answer and whether it held
    more, all within ``target.deadline_s`` (``TimeoutError`` past it). The answer is asked
    for uncompressed whatever the client (the cap counts decoded bytes)."""
    async with (
        asyncio.timeout(target.deadline_s),
        http.stream(
            "POST", url, json=body, headers=IDENTITY_HEADERS, timeout=target.timeout_s
        ) as response,
    ):
        payload, more = await read_capped(response, cap)
        return response.status_code, payload, more


def _failure(exc: httpx.HTTPError | TimeoutError, target: Target) -> str:
    """A request that got no answer, said as a problem or an error."""
    if isinstance(exc, TimeoutError):
        return f"deadline: the request was not over after its deadline_s of {target.deadline_s:g} s"
    return f"{type(exc).__name__}: {excerpt(str(exc))}"


def _over(cap: int, name: str) -> str:
    return f"body over {name} ({cap} bytes): not read further"


def _api_url(target: Target, api: ProbeKind) -> str:
    return dataclasses.replace(target, api=api).url


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


@contextlib.asynccontextmanager
async def _client_for(
    target: Target, client: httpx.AsyncClient | None, connections: int = 2
) -> AsyncIterator[httpx.AsyncClient]:
    """The caller's client, or a fresh one (httpx's default transport: probes are few and
    some are not streams) closed afterwards."""
    if client is not None:
        yield client
        return
    async with make_client(target, max(2, connections), lean=False) as owned:
        yield owned


# --------------------------------------------------------------------------- schema checks

_FINISH = {"stop", "length", "tool_calls", "content_filter", "function_call", "abort", None}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_error(payload: bytes) -> list[str]:
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


def _check_body(payload: bytes, api: ProbeKind, body: Mapping[str, Any]) -> list[str]:
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


def _check_stream(payload: bytes, api: ProbeKind, body: Mapping[str, Any]) -> list[str]:
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
    url = _api_url(target, api)
    try:
        status, payload, more = await _post_capped(http, url, body, target, cap)
    except (httpx.HTTPError, TimeoutError) as exc:
        result.error = _failure(exc, target)
        return None, None
    result.status = status
    if more:
        result.error = f"HTTP {status}: " + _over(cap, "its cap")
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
        _client_for(target, client, width) as http,
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
    url = _api_url(target, api)
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
                await _post_capped(http, url, body, target, background_cap)
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
        _client_for(target, client, width) as http,
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
