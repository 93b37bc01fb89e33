"""The load workloads (normal, peak, overload, recovery): open-loop schedules of synthetic
requests, built by ``build`` or sized by arithmetic by ``plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from loadgen.client import (
    RequestSpec,
)
from loadgen.prompts import (
    LengthDist,
    check_synthetic_prompts,
    sample_lengths,
    synthetic_prompts,
    varied_prompts,
)
from loadgen.schedule import (
    Arrival,
    Phase,
    PhasedSchedule,
    PlannedSize,
    build_offsets,
    build_phased,
    plan_offsets,
    plan_phased,
)
from loadgen.suite.knobs import check_knobs, replace_knobs


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


DEFAULT_EXTRA: Mapping[str, Any] = {"ignore_eos": True, "temperature": 0.0}


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
    extra: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_EXTRA))

    def __post_init__(self) -> None:
        check_knobs(self)

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        me = replace_knobs(self, overrides)
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
        me = replace_knobs(self, overrides)
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
    extra: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_EXTRA))
    after_name: ClassVar[str] = "after"

    def __post_init__(self) -> None:
        check_knobs(self)

    def phases(self) -> list[Phase]:
        out = [Phase("baseline", self.before_s, self.rate, arrival=self.arrival)]
        if self.ramp_s > 0:
            out.append(Phase("ramp", self.ramp_s, self.rate, self.overload_rate, self.arrival))
        out.append(Phase("overload", self.overload_s, self.overload_rate, arrival=self.arrival))
        out.append(Phase(self.after_name, self.after_s, self.rate, arrival=self.arrival))
        return out

    def build(self, seed: int = 0, **overrides: Any) -> BuiltScenario:
        me = replace_knobs(self, overrides)
        schedule = build_phased(me.phases(), seed=seed)
        reqs = _requests(len(schedule.offsets_s), me.prompt_tokens, me.max_tokens, me.extra, seed)
        return BuiltScenario(me.name, reqs, offsets_s=schedule.offsets_s, phases=schedule)

    def plan(self, **overrides: Any) -> PlannedSize:
        """The knobs checked as ``build`` checks them, and the size it will build (module
        docstring): the phases' expected requests, their durations summed."""
        me = replace_knobs(self, overrides)
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
