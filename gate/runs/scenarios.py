"""One load scenario on both engines: the same schedule mirrored to each, looked at while it
runs (the plan's looks may stop it early or let it extend), stopped by a crash or by its
deadline, and handed on as a typed `ScenarioResult` (per-request columns and summaries)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gate.analysis.outputs import MirroredOutputs
from gate.analysis.samples import Columns, columns_from_records
from gate.analysis.sequential import SequentialJudge
from gate.core.errors import DeadlinePassed
from gate.core.limits import Limits, scenario_deadline_s
from gate.core.vocabulary import ROLES
from gate.runs.context import RunContext
from gate.runs.early_stop import EarlyStop, LiveLooks
from gate.runs.engine_pair import Engines
from gate.runs.inputs import RanScenario
from gate.runs.mirrored_outputs import mirrored_outputs, outputs_doc
from gate.runs.schedules import GatePlan, Schedule
from gate.runs.telemetry import start_sampler, telemetry_doc
from gate.runs.workloads import describe_workload, multi_turn_note
from gate.spec import ScenarioSpec
from gate.verdict.document import (
    PhaseMark,
    RunSummaryDoc,
    ScenarioDoc,
    TelemetryDoc,
    WorkloadDoc,
)
from loadgen.metrics import summarize
from loadgen.records import RequestRecord
from loadgen.runner import PairedResult, Pause, run_paired

_T = TypeVar("_T")


@dataclass
class ScenarioResult:
    name: str
    columns: dict[str, Columns]
    summaries: Mapping[str, Mapping[str, Any]]
    duration_s: float
    aborted: bool
    phases: list[tuple[str, float]] = field(default_factory=list)  # (name, start_s)
    planned: int | None = None  # requests per arm after the warm-up, when the plan has it
    early_stop: EarlyStop | None = None  # judged on the prefix its last look saw
    looks: int = 0
    overran: str | None = None  # why it was stopped at its deadline, when it was
    outputs: MirroredOutputs | None = None  # compared at temperature 0 (analysis/outputs.py)
    telemetry: TelemetryDoc | None = None  # the engines' own metrics (gate/telemetry)
    workload: WorkloadDoc | None = None  # what a workload sent (gate/runs/workloads.py)

    def ran(self) -> RanScenario:
        """The scenario as the judge's inputs take it (inputs.py)."""
        upto = self.early_stop.upto if self.early_stop else None
        return RanScenario(self.name, self.columns, upto, self.phases, self.outputs, self.telemetry)

    def describe(self) -> ScenarioDoc:
        early = self.early_stop
        return ScenarioDoc(
            name=self.name,
            duration_s=round(self.duration_s, 3),
            aborted=self.aborted,
            phases=[PhaseMark(name=n, start_s=round(s, 3)) for n, s in self.phases],
            reference=RunSummaryDoc.model_validate(self.summaries["reference"]),
            candidate=RunSummaryDoc.model_validate(self.summaries["candidate"]),
            planned_requests=self.planned,
            looks=self.looks,
            early_stop=early.describe() if early else None,
            outputs=outputs_doc(self.outputs) if self.outputs is not None else None,
            telemetry=self.telemetry,
            workload=self.workload,
        )


def planned_words(planned_s: float | None, limits: Limits) -> str:
    """How a scenario's deadline was reckoned, for its message."""
    base = (
        f"{planned_s:.3g} s planned"
        if planned_s is not None
        else f"no planned duration, so the cap of {limits.max_scenario_duration_s:g} s"
    )
    return f"{base} x {limits.scenario_deadline_factor:g} + {limits.scenario_deadline_slack_s:g} s"


async def bounded(ctx: RunContext, sc: ScenarioSpec, work: Coroutine[Any, Any, _T]) -> _T:
    """A probe suite under its deadline: probes have no planned duration, so the deadline
    is reckoned from the cap on one (gate/core/limits.py); past it the probes are
    cancelled and the gate holds naming the deadline."""
    limit_s = scenario_deadline_s(None, ctx.limits)
    task = asyncio.ensure_future(work)
    try:
        finished, _ = await asyncio.wait({task}, timeout=limit_s)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task in finished:
        return task.result()
    why = planned_words(None, ctx.limits)
    raise DeadlinePassed(f"scenario {sc.name} passed its deadline of {limit_s:g} s ({why})")


@dataclass
class _Counter:
    """Progress of one scenario: results so far out of the total (0: not known)."""

    ctx: RunContext
    name: str
    total: int
    extended_n: int
    looks: LiveLooks | None
    done: int = 0

    def __call__(self, rec: RequestRecord) -> None:
        self.done += 1
        if self.done > self.total * len(ROLES) and self.total:
            self.total = self.extended_n  # running on into the extension
        self.ctx.progress.request_done(self.name, self.done, self.total * len(ROLES))
        if self.looks is not None:
            self.looks.add(rec)


@dataclass
class LoadScenario:
    """One load scenario's run under the gate's plan."""

    ctx: RunContext
    engines: Engines
    gplan: GatePlan
    sc: ScenarioSpec

    def _looks(self, stop: asyncio.Event) -> LiveLooks | None:
        plan, sc = self.gplan.plan, self.sc
        if plan is None or sc.name not in plan.requests:
            return None
        policy = self.ctx.spec.policy

        def stopped(early: EarlyStop) -> None:
            phase = "early_stop" if early.reason != "planned" else "stop"
            self.ctx.gate_phase(phase, early.message)
            stop.set()

        return LiveLooks(
            judge=SequentialJudge(plan),
            scenario=sc.name,
            warmup=policy.warmup_requests,
            look_every=policy.look_every,
            zero_ns=time.monotonic_ns(),
            on_stop=stopped,
            # Goodput, collapse and recovery are judged at the end; the looks do not see them,
            # so such a scenario stops early only on a hold, which they could not undo.
            hold_only=sc.suite in ("peak", "overload", "recovery"),
        )

    def _schedule(self) -> tuple[Schedule, Pause | None, str]:
        """The schedule, extended when the plan allows it, with the pause that holds the
        extension back until the look at the planned size decides whether it runs."""
        sc, plan = self.sc, self.gplan.plan
        sched = self.gplan.schedules[sc.name]
        n = sched.n
        if sched.open_ended:
            detail = f"up to {n} requests in {sc.duration_s:g} s"
        else:
            detail = f"{n} requests"
        if plan is not None and sc.name in plan.requests:
            extra = plan.limit(sc.name) - plan.requests[sc.name]
            if extra > 0:
                # No extension request is sent unjudged.
                pause = Pause(n, asyncio.get_running_loop().create_future())
                sched = sched.extended(self.ctx.spec, sc, extra)
                return sched, pause, detail + f" (up to {sched.n} while a check is undecided)"
        return sched, None, detail

    async def run(self) -> ScenarioResult:
        ctx, sc = self.ctx, self.sc
        first = self.gplan.schedules[sc.name]
        sched, pause, detail = self._schedule()
        total = 0 if first.open_ended else first.n
        ctx.gate_phase(f"scenario:{sc.name}", detail)
        ctx.progress.scenario_started(sc.name, total * len(ROLES))
        stop = asyncio.Event()
        looks = self._looks(stop)
        if pause is not None:
            if looks is not None:
                looks.go = pause.go
            else:  # nothing would ever decide: the plan's size is the end
                pause.go.set_result(False)
        on_record = _Counter(ctx, sc.name, total, sched.n, looks)
        # Its deadline (gate/core/limits.py), from what it plans after any extension: past it
        # the scenario stops like a crash stops it, keeping what finished, and the gate holds.
        planned_s = sc.duration_s if first.open_ended else sched.planned_s
        sampler = start_sampler(ctx, self.engines)  # beside the load, on its own thread
        cpu_before = await asyncio.to_thread(self.engines.cpu_mark, False)
        t0 = time.monotonic()
        try:
            result, aborted, overran = await self._mirror(sched, pause, stop, on_record, planned_s)
        finally:
            timelines = await asyncio.to_thread(sampler.stop) if sampler is not None else None
        duration = time.monotonic() - t0
        cpu_after = await asyncio.to_thread(self.engines.cpu_mark, True)
        contended = self.engines.contention_note(sc.name, cpu_before, cpu_after, duration)
        if contended is not None:
            ctx.notes.append(contended)
        self.engines.check_crashes()
        ctx.progress.scenario_finished(sc.name)
        out = self._result(sched, result, duration, aborted, looks, overran)
        if sampler is not None and timelines is not None:
            gpu_notes = self.engines.gpu_sources().notes
            out.telemetry = telemetry_doc(sampler.interval_s, timelines, gpu_notes)
        return out

    async def _mirror(
        self,
        sched: Schedule,
        pause: Pause | None,
        stop: asyncio.Event,
        on_record: _Counter,
        planned_s: float | None,
    ) -> tuple[PairedResult, bool, str | None]:
        """Send the schedule to both engines until it ends, a crash, the closed loop's
        duration or the deadline; returns the records, whether it was aborted, and why the
        deadline stopped it (None: it did not)."""
        sc, loop = self.sc, asyncio.get_running_loop()
        watcher = asyncio.create_task(self.engines.watch(stop))
        timer = None
        if sc.arrival == "concurrency" and sc.duration_s is not None:
            timer = loop.call_later(sc.duration_s, stop.set)
        limit_s = scenario_deadline_s(planned_s, self.ctx.limits)
        overran: list[str] = []

        def overrun() -> None:
            why = planned_words(planned_s, self.ctx.limits)
            overran.append(f"scenario {sc.name} passed its deadline of {limit_s:g} s ({why})")
            stop.set()

        overdue = loop.call_later(limit_s, overrun)
        try:
            result = await run_paired(
                self.engines.targets(sc.api),
                sched.requests,
                offsets_s=sched.offsets,
                concurrency=sched.concurrency,
                on_record=on_record,
                stop=stop,
                pause=pause,
            )
        finally:
            aborted = stop.is_set() and (bool(self.engines.crashes) or bool(overran))
            overdue.cancel()
            stop.set()
            if timer is not None:
                timer.cancel()
            await watcher
            if on_record.looks is not None:
                await on_record.looks.close()
        return result, aborted, overran[0] if overran else None

    def _result(
        self,
        sched: Schedule,
        result: PairedResult,
        duration: float,
        aborted: bool,
        looks: LiveLooks | None,
        overran: str | None,
    ) -> ScenarioResult:
        phases = self.gplan.schedules[self.sc.name].phases  # an extension has none
        phase_of = phases.phase_index if phases is not None else None
        columns: dict[str, Columns] = {
            role: columns_from_records(result.records.get(role, []), result.start_ns, phase_of)
            for role in ROLES
        }
        summaries: dict[str, Mapping[str, Any]] = {
            role: summarize(result.records.get(role, []), duration) for role in ROLES
        }
        marks = (
            [(p.name, s) for p, s in zip(phases.phases, phases.starts_s, strict=True)]
            if phases is not None
            else []
        )
        plan = self.gplan.plan
        greedy = bool(sched.requests) and sched.requests[0].extra.get("temperature") == 0
        traffic = sched.traffic
        # A later turn carries each engine's own earlier answers: not a mirrored request.
        later = traffic.later_turns if traffic is not None else frozenset()
        outputs = (
            mirrored_outputs(
                self.sc.name, result.records, self.ctx.spec.policy.divergence.early_tokens, later
            )
            if greedy
            else None
        )
        workload = describe_workload(self.sc, traffic) if traffic is not None else None
        if workload is not None and workload.later_turns:
            self.ctx.notes.append(multi_turn_note(self.sc.name, workload))
        return ScenarioResult(
            self.sc.name,
            columns,
            summaries,
            duration,
            aborted,
            marks,
            planned=plan.requests.get(self.sc.name) if plan is not None else None,
            early_stop=looks.stopped if looks is not None else None,
            looks=looks.looks if looks is not None else 0,
            overran=overran,
            outputs=outputs,
            workload=workload,
        )
