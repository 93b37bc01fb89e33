"""What each load scenario sends and when: its requests (built on demand, each reproducible from
the seed and its index), its send offsets or concurrency, its planned size and duration, and the
extension a plan may add. The plan itself (analysis/plan.py) is fixed here, from every
scenario's size, before the first sample."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import numpy as np

from gate.analysis.plan import Plan
from gate.core.errors import FieldProblem, ShortScenario, SpecError
from gate.core.limits import Limits
from gate.runs.workloads import WorkloadFiles, build_workload
from gate.spec import GateSpec, ScenarioSpec
from loadgen import suite as suite_catalogue
from loadgen.client import RequestSpec
from loadgen.prompts import synthetic_prompts
from loadgen.schedule import PhasedSchedule, build_offsets
from loadgen.traffic import Traffic

PROMPT_BLOCK = 256  # prompts are made this many at a time, one seed per block


class _IndexedRequests(Sequence[RequestSpec]):
    """A request sequence built on demand by index: subclasses give `__len__` and `_at(i)`
    for 0 <= i < len; slicing, negative indices and iteration are here."""

    def _at(self, i: int) -> RequestSpec:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[RequestSpec]: ...

    def __getitem__(self, i: int | slice) -> RequestSpec | Sequence[RequestSpec]:
        n = len(self)
        if isinstance(i, slice):
            return [self._at(j) for j in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._at(i)

    def __iter__(self) -> Iterator[RequestSpec]:
        for i in range(len(self)):
            yield self._at(i)


class LazyRequests(_IndexedRequests):
    """Requests built on demand, each one reproducible from (seed, index) alone."""

    def __init__(self, scenario: ScenarioSpec, seed: int, length: int) -> None:
        self._sc = scenario
        self._seed = seed
        self._len = length
        self._extra: dict[str, Any] = {
            "ignore_eos": scenario.ignore_eos,
            "temperature": scenario.temperature,
        }
        self._block: tuple[int, list[str]] = (-1, [])

    def __len__(self) -> int:
        return self._len

    def _at(self, i: int) -> RequestSpec:
        block = i // PROMPT_BLOCK
        if self._block[0] != block:
            prompts = synthetic_prompts(
                PROMPT_BLOCK, self._sc.prompt_tokens, seed=self._seed * 1_000_003 + block
            )
            self._block = (block, prompts)
        prompt = self._block[1][i % PROMPT_BLOCK]
        return RequestSpec(
            request_id=i, prompt=prompt, max_tokens=self._sc.max_tokens, extra=self._extra
        )


class Chained(_IndexedRequests):
    """A schedule's requests followed by its extension's, numbered on from the first."""

    def __init__(self, first: Sequence[RequestSpec], then: Sequence[RequestSpec]) -> None:
        self._first = first
        self._then = then

    def __len__(self) -> int:
        return len(self._first) + len(self._then)

    def _at(self, i: int) -> RequestSpec:
        n = len(self._first)
        if i < n:
            return self._first[i]
        return replace(self._then[i - n], request_id=i)


def scenario_seed(spec: GateSpec, sc: ScenarioSpec) -> int:
    return spec.seed * 7_777 + spec.stages.index(sc)


@dataclass(frozen=True)
class Schedule:
    """A load scenario's requests and when to send them (offsets, or a concurrency)."""

    requests: Sequence[RequestSpec]
    offsets: np.ndarray | None
    concurrency: int | None
    phases: PhasedSchedule | None
    n: int  # an open-ended closed loop: the most it may send (the per-scenario cap)
    open_ended: bool = False  # a closed loop for a duration: its size is not known in advance
    traffic: Traffic | None = None  # a workload's (gate/runs/workloads.py)

    @classmethod
    def of(
        cls, spec: GateSpec, sc: ScenarioSpec, limits: Limits, files: WorkloadFiles | None = None
    ) -> Schedule:
        """The scenario's schedule: a suite's, a workload's, a closed loop, or an arrival
        process."""
        seed = scenario_seed(spec, sc)
        if sc.workload is not None:
            at = f"scenarios[{spec.scenarios.index(sc)}]"
            t = build_workload(sc, at, seed, limits, files or WorkloadFiles())
            return cls(t.requests, t.offsets_s, None, None, len(t.requests), traffic=t)
        if sc.suite is not None:
            built = suite_catalogue.get(sc.suite, **sc.settings).build(seed=seed)
            n = len(built.requests)
            return cls(built.requests, built.offsets_s, built.concurrency, built.phases, n)
        if sc.arrival == "concurrency":
            # A closed loop for a duration ends at its duration or at the cap, what comes first.
            n = limits.max_scenario_requests if sc.requests is None else sc.requests
            reqs = LazyRequests(sc, seed=seed, length=n)
            return cls(reqs, None, sc.concurrency, None, n, open_ended=sc.requests is None)
        offsets = build_offsets(**sc.open_loop(), seed=seed)
        n = int(offsets.size)
        return cls(LazyRequests(sc, seed=seed, length=n), offsets, None, None, n)

    @property
    def planned_s(self) -> float | None:
        """Seconds of load it plans (the last send; a phased schedule's phases), or None
        when that is not known in advance (a closed loop of a number of requests)."""
        if self.phases is not None:
            return self.phases.duration_s
        if self.offsets is not None:
            return float(self.offsets[-1]) if self.offsets.size else 0.0
        return None

    def extendable(self, sc: ScenarioSpec) -> bool:
        """Steady open-loop load may run on past its plan (policy `extend`); phased load
        (peak, overload, recovery) has a shape that more requests would change."""
        return (
            self.offsets is not None
            and self.phases is None
            and sc.suite in (None, "normal")
            and sc.workload is None  # more of a workload would be another workload
            and self.n >= 2
        )

    def extended(self, spec: GateSpec, sc: ScenarioSpec, extra: int) -> Schedule:
        """The schedule with `extra` more requests after it: the same arrival process at the
        same mean rate, new prompts (another seed, so no prefix cache flatters them)."""
        assert self.offsets is not None and extra > 0
        seed = scenario_seed(spec, sc) * 2 + 1_000_001
        more: Sequence[RequestSpec]
        offsets: np.ndarray | None
        if sc.suite is not None:
            built = suite_catalogue.get(sc.suite, **sc.settings).build(
                seed=seed, requests=extra, duration_s=None
            )
            more, offsets = built.requests, built.offsets_s
        else:
            assert sc.rate is not None and sc.arrival != "concurrency"
            offsets = build_offsets(
                sc.arrival, sc.rate, requests=extra, burstiness=sc.burstiness, seed=seed
            )
            more = LazyRequests(sc, seed=seed, length=extra)
        assert offsets is not None
        last = float(self.offsets[-1])
        gap = last / (self.n - 1) if last > 0 else 0.0
        joined = np.concatenate([self.offsets, offsets + last + gap])
        return Schedule(Chained(self.requests, more), joined, None, None, self.n + extra)


@dataclass(frozen=True)
class GatePlan:
    """Every load scenario's schedule, and the plan fixed from their sizes (None: nothing
    stops early, each scenario is judged once at its end; `notes` say why)."""

    schedules: dict[str, Schedule]
    plan: Plan | None
    notes: tuple[str, ...] = ()


def plan_gate(spec: GateSpec, limits: Limits, files: WorkloadFiles | None = None) -> GatePlan:
    """Fix every load scenario's checks, tunings and alphas before the first sample
    (analysis/plan.py), from the schedules' sizes alone; a workload's files are read under
    `files` (gate/runs/workloads.py)."""
    warm = spec.policy.warmup_requests
    schedules = {
        sc.name: Schedule.of(spec, sc, limits, files)
        for sc in spec.scenarios
        if sc.is_load  # a probe has no schedule, a search no fixed one
    }
    sizes: dict[str, int] = {}
    for name, sched in schedules.items():
        if sched.open_ended:
            note = (
                f"No early stop in this gate: {name} runs closed loop for a duration, so "
                "its size is not known in advance; each scenario was judged once, at its end."
            )
            return GatePlan(schedules, None, (note,))
        if sched.n <= warm:
            note = (
                f"No early stop in this gate: {name} has {sched.n} requests, none left after "
                f"the {warm}-request warm-up."
            )
            return GatePlan(schedules, None, (note,))
        sizes[name] = sched.n - warm
    if not sizes:
        return GatePlan(schedules, None)
    by_name = {sc.name: sc for sc in spec.scenarios}
    extendable = {name for name in sizes if schedules[name].extendable(by_name[name])}
    # Blocks in time: each judged request's intended send offset, known before the load.
    times = {
        name: np.asarray(sched.offsets[warm:], np.float64)
        for name, sched in schedules.items()
        if name in sizes and sched.offsets is not None
    }
    try:
        plan = Plan.build(spec.policy, sizes, extendable, times=times)
    except ShortScenario as exc:
        index = next(i for i, sc in enumerate(spec.scenarios) if sc.name == exc.scenario)
        raise SpecError([FieldProblem(f"scenarios.{index}", str(exc))]) from None
    return GatePlan(schedules, plan)


def plan_problems(
    spec: GateSpec, limits: Limits, files: WorkloadFiles | None = None
) -> list[FieldProblem]:
    """What the plan refuses before any load (a scenario too short to decide, a workload
    file's mistakes), as spec mistakes, so the CLI and the API refuse the spec before a gate
    is queued."""
    try:
        plan_gate(spec, limits, files)
    except SpecError as exc:
        return list(exc.all_problems)
    return []
