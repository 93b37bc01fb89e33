"""A suite entry's knobs, checked by type and bound: a caller writes them in a spec."""

from __future__ import annotations

import dataclasses
import math
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

from loadgen.prompts import (
    LengthDist,
)
from loadgen.schedule import (
    ARRIVALS,
    MAX_REQUESTS,
)

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


def _slo_rule(knob: str, value: Any) -> list[tuple[str, str]]:
    """A capacity scenario's objectives: some of ttft_ms, itl_ms, e2e_ms, at least one."""
    keys = ("ttft_ms", "itl_ms", "e2e_ms")
    if not isinstance(value, Mapping) or not value:
        return [
            (knob, f"must be an object with at least one of {', '.join(keys)}, got {_said(value)}")
        ]
    out: list[tuple[str, str]] = []
    for key, v in value.items():
        path = f"{knob}.{_key(str(key))}"
        if key not in keys:
            out.append((path, f"not an objective (the objectives: {', '.join(keys)})"))
        elif (why := _real(v, 0.0, MAX_SLO_MS, above=True, unit=" ms")) is not None:
            out.append((path, why))
    return out


_CAPACITY_RULES: dict[str, Rule] = {
    "slo": _slo_rule,
    "goodput": _one(lambda v: _real(v, 0.0, 1.0, above=True)),
    "start_rate": _rate(True),
    "max_rate": _rate(True),
    "growth": _one(lambda v: _real(v, 1.0, 10.0, above=True)),
    "resolution": _one(lambda v: _real(v, 0.005, 0.5)),
    "step_s": _one(lambda v: _real(v, 0.0, 3_600.0, above=True, unit=" s")),
    "repeats": _one(lambda v: _integer(v, 0, 5)),
    "require_decided": _one(_boolean),
    **_LOAD_RULES,
}
RULES: Mapping[str, Mapping[str, Rule]] = {
    "normal": _STEADY_RULES,
    "peak": {**_STEADY_RULES, "slo_ttft_ms": _SLO, "slo_itl_ms": _SLO, "slo_e2e_ms": _SLO},
    "overload": _PHASED_RULES,
    "recovery": _PHASED_RULES,
    "capacity": _CAPACITY_RULES,
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


def check_knobs(entry: Any) -> None:
    """Refuse the first bad knob of a new entry (:func:`knob_problems`)."""
    values = {f.name: getattr(entry, f.name) for f in knob_fields(entry)}
    problems = knob_problems(entry.name, values)
    if problems:
        raise KnobError(*problems[0])


def knob_fields(entry: Any) -> list[dataclasses.Field[Any]]:
    """An entry's fields a spec may set: all but those the gate sets itself (`knob: False`)."""
    return [f for f in dataclasses.fields(entry) if f.metadata.get("knob", True)]


def replace_knobs(obj: Any, overrides: Mapping[str, Any]) -> Any:
    if not overrides:
        return obj
    names = {f.name for f in knob_fields(obj)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        known = ", ".join(sorted(names))
        raise ValueError(f"{obj.name}: unknown setting(s) {', '.join(unknown)} (known: {known})")
    return dataclasses.replace(obj, **overrides)
