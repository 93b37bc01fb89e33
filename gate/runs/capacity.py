"""A capacity scenario on both engines: the paired search over offered rate
(`loadgen/suite/capacity.py` decides each next rate; `gate/analysis/capacity.py` judges).

Each step is one seeded schedule at one rate, mirrored to both engines at the same instants
by `loadgen.runner.run_paired` exactly as a load scenario is; the step ends when every request
has finished or at its cut, `2 x step_s` plus the largest SLO after its start: a request still
in flight then is counted as not good (it had waited at least a whole step). Steps run one
after another on the engines the gate launched, a crash stops the search, and the whole
search is bounded by the scenario deadline reckoned from its planned seconds (the step budget
x `step_s`, gate/core/limits.py), so a search never outlasts what the caps allowed. Each step
records how long tasks waited for the gate host's CPUs while it ran, and how busy those were
(gate/telemetry/host_cpu.py): the judge will not compare knees that contention for the CPUs
may have set (gate/analysis/capacity.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gate.analysis.capacity import EngineStep
from gate.analysis.load import Slo
from gate.analysis.samples import columns_from_records
from gate.core.errors import DeadlinePassed
from gate.core.limits import scenario_deadline_s
from gate.core.vocabulary import ROLES
from gate.runs.context import RunContext
from gate.runs.engine_pair import Engines
from gate.runs.load_phases import request_log
from gate.runs.scenarios import planned_words
from gate.runs.schedules import scenario_seed
from gate.spec import ScenarioSpec
from gate.telemetry.host_cpu import HostCpu, busy_share, stall_share
from gate.verdict.document import CapacityDoc, CapacityEngineDoc, CapacityStepDoc
from loadgen import suite as catalogue
from loadgen.records import RequestRecord
from loadgen.runner import run_paired
from loadgen.suite.capacity import RATE_DIGITS


def slo_of(entry: catalogue.Capacity) -> Slo:
    return Slo(
        ttft_ms=entry.slo.get("ttft_ms"),
        itl_ms=entry.slo.get("itl_ms"),
        e2e_ms=entry.slo.get("e2e_ms"),
    )


def engine_step(records: Sequence[RequestRecord], sent: int, start_ns: int, slo: Slo) -> EngineStep:
    """One engine's step: of the `sent` requests, how many met every SLO (those with no
    record, cut before they finished, did not), and its median TTFT and ITL."""
    cols = columns_from_records(list(records), start_ns, None)
    log = request_log(cols)
    good = int(slo.met(log).sum()) if len(records) else 0
    ok = log.ok

    def median(values: np.ndarray) -> float | None:
        v = values[ok & np.isfinite(values)]
        return round(float(np.median(v)), 3) if v.size else None

    return EngineStep(sent, good, median(log.ttft_ms), median(log.itl_ms))


def _doc(step: EngineStep) -> CapacityEngineDoc:
    return CapacityEngineDoc(
        sent=step.sent,
        good=step.good,
        goodput=round(step.goodput, 6),
        ttft_p50_ms=step.ttft_p50_ms,
        itl_p50_ms=step.itl_p50_ms,
    )


@dataclass
class CapacityResult:
    """The search as it ran, for the judge and the document."""

    doc: CapacityDoc
    overran: str | None = None


@dataclass
class CapacityScenario:
    """One capacity scenario's search under the gate's caps."""

    ctx: RunContext
    engines: Engines
    sc: ScenarioSpec
    cpu: HostCpu = field(default_factory=HostCpu)

    @property
    def entry(self) -> catalogue.Capacity:
        entry = catalogue.get("capacity", **self.sc.settings)
        assert isinstance(entry, catalogue.Capacity)
        return entry

    async def run(self) -> CapacityResult:
        ctx, sc, entry = self.ctx, self.sc, self.entry
        search = entry.search(ROLES, boundary=1.0 - ctx.spec.policy.load.capacity_tolerance)
        planned_s = entry.max_steps() * entry.step_s
        limit_s = scenario_deadline_s(planned_s, ctx.limits)
        ctx.gate_phase(
            f"scenario:{sc.name}",
            f"capacity search: at most {entry.max_steps()} steps of {entry.step_s:g} s",
        )
        ctx.progress.scenario_started(sc.name, entry.max_steps())
        t0 = time.monotonic()
        steps: list[CapacityStepDoc] = []
        overran: str | None = None
        while (nxt := search.next()) is not None:
            left = limit_s - (time.monotonic() - t0)
            rate, stage = nxt
            step = self._step(rate, len(steps))
            before = self.cpu.read()
            try:
                got = await asyncio.wait_for(step, timeout=max(left, 0.0))
            except TimeoutError:
                why = planned_words(planned_s, ctx.limits)
                overran = f"scenario {sc.name} passed its deadline of {limit_s:g} s ({why})"
                break
            search.record(rate, stage, {role: got[role].goodput for role in ROLES})
            steps.append(
                CapacityStepDoc(
                    rate=round(rate, RATE_DIGITS),
                    stage=stage,
                    reference=_doc(got["reference"]),
                    candidate=_doc(got["candidate"]),
                    host_cpu=_share(busy_share(before, after := self.cpu.read())),
                    cpu_stall=_share(stall_share(before, after)),
                )
            )
            ctx.gate_phase(f"capacity:{sc.name}", _step_words(steps[-1]))
            ctx.progress.request_done(sc.name, len(steps), entry.max_steps())
            self.engines.check_crashes()
            if self.engines.crashes:
                search.stopped = "an engine crashed"
                break
        ctx.progress.scenario_finished(sc.name)
        doc = CapacityDoc(
            name=sc.name,
            target=entry.goodput,
            slo=slo_of(entry).describe(),
            resolution=entry.resolution,
            require_decided=entry.require_decided,
            stopped=search.stopped or (overran or ""),
            duration_s=round(time.monotonic() - t0, 3),
            aborted=overran is not None or bool(self.engines.crashes),
            shares_host=self.engines.share_host_cpus(),
            cpu_stall_limit=ctx.spec.policy.load.capacity_cpu_stall,
            steps=steps,
        )
        return CapacityResult(doc, overran)

    async def _step(self, rate: float, index: int) -> Mapping[str, EngineStep]:
        """One paired step at `rate` (module docstring). Its gaps are the scenario's one
        pattern, rescaled to the step: every step of the search, a repeat included, draws the
        same sequence of gaps (common random numbers: both engines' knees are found on one
        traffic shape, and a repeat measures the engines and the host again, not the luck of
        another shape; docs/statistics.md, "Capacity"). Its prompts are new at every step
        (`index`), so no step warms an engine's prefix cache for a later one."""
        entry = self.entry
        seed = scenario_seed(self.ctx.spec, self.sc) * 1_000
        built = entry.search_step(rate, seed, index)
        assert built.offsets_s is not None
        stop = asyncio.Event()
        watcher = asyncio.create_task(self.engines.watch(stop))
        cut_s = 2 * entry.step_s + max(entry.slo.values()) / 1000.0
        cut = asyncio.get_running_loop().call_later(cut_s, stop.set)
        try:
            result = await run_paired(
                self.engines.targets(self.sc.api),
                built.requests,
                offsets_s=built.offsets_s,
                stop=stop,
            )
        finally:
            cut.cancel()
            stop.set()
            await watcher
        slo = slo_of(entry)
        n = len(built.requests)
        return {
            role: engine_step(result.records.get(role, []), n, result.start_ns, slo)
            for role in ROLES
        }


def _share(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _step_words(step: CapacityStepDoc) -> str:
    sides = f"reference {step.reference.goodput:.1%}, candidate {step.candidate.goodput:.1%}"
    cpu = [
        f"{v:.0%} {what}"
        for v, what in ((step.cpu_stall, "waited for a CPU"), (step.host_cpu, "CPUs busy"))
        if v is not None
    ]
    host = f"; host: {', '.join(cpu)}" if cpu else ""
    return f"{step.stage} at {step.rate:.3g} req/s: goodput {sides}{host}"


async def run_capacity(
    ctx: RunContext, engines: Engines, sc: ScenarioSpec, into: list[CapacityDoc]
) -> None:
    """The search, its document added to `into` (the steps that ran, whatever stopped it);
    past its deadline the gate holds naming it."""
    result = await CapacityScenario(ctx, engines, sc).run()
    into.append(result.doc)
    if result.overran is not None:
        raise DeadlinePassed(result.overran)
