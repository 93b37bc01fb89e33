"""A spec against the operator's caps (`gate/core/limits.py`): every way it asks for more than
they allow, each naming the field path, the value and the cap with its setting.

Sizes are the planned ones, by arithmetic from the spec (`loadgen.suite` entries' `plan()`,
`loadgen.schedule.plan_offsets`), never by building a schedule (the module docstring of
`gate/core/limits.py` says why).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gate.core.errors import FieldProblem
from gate.core.limits import Limits
from gate.spec.gate_spec import GateSpec
from gate.spec.scenarios import ScenarioSpec

__all__ = ["ScenarioSize", "scenario_size", "spec_limit_problems"]


def _env(name: str) -> str:
    return f"GATE_{name.upper()}"


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True, slots=True)
class ScenarioSize:
    """A scenario's planned size: requests per arm (None: a closed loop for a duration) and
    seconds of load (None: not planned in time)."""

    requests: int | None
    duration_s: float | None
    exact: bool
    driver: str  # the field the count follows: requests or duration_s; "" for phases, probes
    rate: float | None  # requests/s of a steady open loop
    load: bool  # load scenarios count toward the gate's total; probe suites do not
    extendable: bool  # steady open loop: policy `extend` may run it on past its plan


def scenario_size(sc: ScenarioSpec) -> ScenarioSize:
    """By arithmetic, never by building (module docstring); `sc` was validated, so the
    arithmetic cannot fail here."""
    from loadgen import suite as catalogue
    from loadgen.schedule import plan_offsets

    if sc.suite is not None:
        entry = catalogue.get(sc.suite, **sc.settings)
        size = entry.plan()
        if isinstance(entry, catalogue.Steady):
            driver = "duration_s" if entry.duration_s is not None else "requests"
            rate: float | None = entry.rate
        else:
            driver, rate = "", None
        return ScenarioSize(
            size.requests,
            size.duration_s,
            size.exact,
            driver,
            rate,
            load=not sc.is_probe,
            extendable=sc.suite == "normal" and size.requests >= 2,
        )
    if sc.workload is not None:
        return _workload_size(sc)
    if sc.arrival == "concurrency":
        driver = "requests" if sc.requests is not None else "duration_s"
        return ScenarioSize(sc.requests, sc.duration_s, True, driver, None, True, False)
    size = plan_offsets(**sc.open_loop())
    driver = "requests" if sc.requests is not None else "duration_s"
    return ScenarioSize(
        size.requests, size.duration_s, size.exact, driver, sc.rate, True, size.requests >= 2
    )


def _workload_size(sc: ScenarioSpec) -> ScenarioSize:
    """A workload's size as far as arithmetic knows it: a trace's `requests` or
    `duration_s` (else unknown until its file is read: gate/runs/workloads.py checks the
    built schedule against the same caps), or the scenario's arrivals times the longest
    session; a workload is never extended (more of it would be another workload)."""
    from loadgen.schedule import plan_offsets

    assert sc.workload is not None
    driver = "requests" if sc.requests is not None else "duration_s"
    if sc.workload.trace is not None:
        driver = driver if sc.requests is not None or sc.duration_s is not None else ""
        return ScenarioSize(sc.requests, sc.duration_s, False, driver, sc.rate, True, False)
    size = plan_offsets(**sc.open_loop())  # not concurrency: refused beside a workload
    turns = max((p.turns or 1) for p in sc.workload.mix)
    exact = size.exact and turns == 1
    return ScenarioSize(size.requests * turns, size.duration_s, exact, driver, sc.rate, True, False)


def _cap(
    path: str, value: float, limits: Limits, cap_name: str, what: str, text: str = ""
) -> list[FieldProblem]:
    """[the problem] when `value` is above the cap `cap_name`; `text` says the value in words."""
    cap = getattr(limits, cap_name)
    if value <= cap:
        return []
    said = text or _num(value)
    return [FieldProblem(path, f"{said} is above the cap of {_num(cap)} {what} ({_env(cap_name)})")]


def _requests_text(sc: ScenarioSpec, size: ScenarioSize) -> str:
    if size.driver == "requests":
        return str(size.requests)
    if size.driver == "duration_s":
        return (
            f"{_num(size.duration_s or 0.0)} s at {_num(size.rate or 0.0)} requests/s plan "
            f"{'' if size.exact else 'about '}{size.requests} requests, which"
        )
    return f"the {sc.suite} suite plans about {size.requests} requests, which"


def spec_limit_problems(spec: GateSpec, limits: Limits) -> list[FieldProblem]:
    """Every way `spec` asks for more than `limits` allow, each naming the field path, the
    value and the cap with its setting. Pure: no schedule is built, nothing is read."""
    out = _cap(
        "scenarios",
        len(spec.scenarios),
        limits,
        "max_scenarios",
        "scenarios per gate",
        f"{len(spec.scenarios)} scenarios",
    )
    total = 0
    planned_s = 0.0
    for i, sc in enumerate(spec.scenarios):
        problems, requests, seconds = _scenario_problems(f"scenarios[{i}]", sc, spec, limits)
        out += problems
        total += requests
        planned_s += seconds
    out += _added_stage_problems(spec, limits)
    out += _cap(
        "scenarios",
        total,
        limits,
        "max_gate_requests",
        "requests per gate",
        f"{total} planned requests per arm in all (extensions included)",
    )
    out += _cap("shape.wait_s", spec.shape.wait_s, limits, "max_wait_s", "seconds of waiting")
    for role in ("reference", "candidate"):
        timeout = getattr(spec, role).readiness_timeout_s
        out += _cap(
            f"{role}.readiness_timeout_s",
            timeout,
            limits,
            "max_readiness_timeout_s",
            "seconds to become ready",
        )
    return out + _deadline_problems(spec, limits, planned_s)


def _scenario_problems(
    at: str, sc: ScenarioSpec, spec: GateSpec, limits: Limits
) -> tuple[list[FieldProblem], int, float]:
    """One listed scenario's problems, the requests per arm it adds to the gate's total
    (extensions included) and its planned seconds of load."""
    size = scenario_size(sc)
    out: list[FieldProblem] = []
    total, planned_s = 0, 0.0
    if size.load and size.requests is not None:
        path = f"{at}.{size.driver}" if size.driver else at
        out += _cap(
            path,
            size.requests,
            limits,
            "max_scenario_requests",
            "requests per scenario",
            _requests_text(sc, size),
        )
        extend = spec.policy.extend if size.extendable else 0.0
        total += size.requests + math.ceil(size.requests * extend)
    elif size.load:  # a closed loop for a duration: the runner stops it at the cap
        total += limits.max_scenario_requests
    if size.load and size.duration_s is not None:
        planned_s += size.duration_s
        by_field = size.driver == "duration_s"
        out += _cap(
            f"{at}.duration_s" if by_field else at,
            size.duration_s,
            limits,
            "max_scenario_duration_s",
            "seconds per scenario",
            "" if by_field else f"{size.duration_s:.0f} s of planned load",
        )
    out += _scenario_knob_problems(at, sc, limits) + _workload_knob_problems(at, sc, limits)
    return out, total, planned_s


def _workload_knob_problems(at: str, sc: ScenarioSpec, limits: Limits) -> list[FieldProblem]:
    """Each part's lengths and turns against the caps (a part's file is checked when the
    gate reads it: gate/runs/workloads.py)."""
    if sc.workload is None:
        return []
    out: list[FieldProblem] = []
    for i, part in enumerate(sc.workload.mix):
        where = f"{at}.workload.mix[{i}]"
        prompt = (part.prompt_tokens or sc.prompt_tokens) + (part.prefix_tokens or 0)
        out += _cap(f"{where}.prompt_tokens", prompt, limits, "max_prompt_tokens", "prompt tokens")
        if part.max_tokens is not None:
            out += _cap(
                f"{where}.max_tokens", part.max_tokens, limits, "max_output_tokens", "output tokens"
            )
        if part.turns is not None:
            out += _cap(f"{where}.turns", part.turns, limits, "max_session_turns", "turns")
    return out


def _added_stage_problems(spec: GateSpec, limits: Limits) -> list[FieldProblem]:
    """The stage the gate adds (GateSpec.added_correctness) meets the same caps; the
    operator's are the ones a spec cannot see, so the problem says how to leave it out."""
    added = spec.added_correctness
    if added is None:
        return []
    return [
        FieldProblem(
            "correctness",
            f"the default correctness stage ({p.path.removeprefix('correctness.')}): "
            f"{p.message}; set `correctness: off` or list a smaller "
            "`{suite: correctness}` scenario",
        )
        for p in _scenario_knob_problems("correctness", added, limits)
    ]


def _deadline_problems(spec: GateSpec, limits: Limits, planned_s: float) -> list[FieldProblem]:
    out: list[FieldProblem] = []
    if spec.deadline_s is not None:
        out += _cap("deadline_s", spec.deadline_s, limits, "max_deadline_s", "seconds per gate")
    deadline = limits.gate_deadline_s(spec)
    if planned_s > deadline:
        out.append(
            FieldProblem(
                "deadline_s",
                f"the scenarios plan {planned_s:.0f} s of load, more than the gate deadline of "
                f"{_num(deadline)} s: give a longer deadline_s (the cap is "
                f"{_num(limits.max_deadline_s)} s, {_env('max_deadline_s')}) or shorter scenarios",
            )
        )
    return out


_OUTPUT_KEYS = ("max_tokens", "max_completion_tokens", "min_tokens")
_FAN_OUT_KEYS = ("n", "best_of")


def _scenario_knob_problems(at: str, sc: ScenarioSpec, limits: Limits) -> list[FieldProblem]:
    """Rates, concurrency, tokens and probe settings of one scenario (explicit or a suite's
    knobs, which a spec writes beside `suite:` and which are named that way)."""
    out: list[FieldProblem] = []
    fields: dict[str, Any]
    if sc.suite is None:
        fields = {
            "rate": sc.rate,
            "concurrency": sc.concurrency,
            "prompt_tokens": sc.prompt_tokens,
            "max_tokens": sc.max_tokens,
        }
    else:
        from loadgen import suite as catalogue

        entry = catalogue.get(sc.suite, **sc.settings)
        fields = {f.name: getattr(entry, f.name) for f in dataclasses.fields(entry)}
    caps = {
        "rate": ("max_rate", "requests/s"),
        "overload_rate": ("max_rate", "requests/s"),
        "start_rate": ("max_rate", "requests/s"),  # a capacity search's rates
        "max_rate": ("max_rate", "requests/s"),
        "concurrency": ("max_concurrency", "requests in flight"),
        "prompt_tokens": ("max_prompt_tokens", "prompt tokens"),
        "max_model_len": ("max_prompt_tokens", "prompt tokens"),
        "max_tokens": ("max_output_tokens", "output tokens"),
        "probes_count": ("max_probes", "probes"),
        "envelope_load": ("max_envelope_load", "background requests"),
    }
    for key, (cap_name, what) in caps.items():
        given = fields.get(key)
        value = _largest(given)
        if value is not None:
            out += _cap(f"{at}.{key}", value, limits, cap_name, what)
        elif given is not None:  # fail closed: a value no cap can read is not let through
            out.append(FieldProblem(f"{at}.{key}", _UNCHECKABLE))
    extra = fields.get("extra")
    if extra is not None and not isinstance(extra, Mapping):
        out.append(FieldProblem(f"{at}.extra", _UNCHECKABLE))
    if isinstance(extra, Mapping):
        # The suite admits none of these keys (loadgen.suite.EXTRA_REFUSED); capped here too,
        # so a caller's extra cannot raise the output or the fan-out past the caps either way.
        for key in _OUTPUT_KEYS:
            value = _largest(extra.get(key))
            if value is not None:
                out += _cap(
                    f"{at}.extra.{key}", value, limits, "max_output_tokens", "output tokens"
                )
        for key in _FAN_OUT_KEYS:
            value = _largest(extra.get(key))
            if value is not None and value > 1:
                out.append(
                    FieldProblem(
                        f"{at}.extra.{key}",
                        f"{_num(value)} completions per request: the gate sends and judges one "
                        "per request, so more would be work nobody judges (at most 1)",
                    )
                )
    return out


_UNCHECKABLE = "not a value the operator's caps can check (a number, or a length distribution)"


def _largest(value: Any) -> float | None:
    """A number knob's value, a length distribution's maximum; None for anything else (a NaN
    too: no cap can hold it)."""
    from loadgen.prompts import LengthDist

    if isinstance(value, LengthDist):
        value = value.maximum
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
