"""One gate run as a state machine: reserve -> launch -> warm up -> scenarios -> judge ->
teardown -> finish. Each stage lives in its own module and hands the next a typed result:

    reservations/service.py   the GPUs (reserve or wait, keep alive, release)
    runs/engine_pair.py           both engines, by kind (launch, warm-up, crash watch, teardown)
    runs/schedules.py         what each load scenario sends, and the plan fixed from it
    runs/scenarios.py         one load scenario   -> ScenarioResult
    runs/probes.py            the probe suites    -> ProbeDoc, CorrectnessResult
    runs/inputs.py            the judge's inputs (the same for re-judge)
    runs/record.py            the verdict document, the report, the stored record

The one rule: whatever happens (a hold, an engine that never got ready, an unreachable URL,
Ctrl-C, the deadline) the engines are torn down, the GPUs released, and the gate row says how
it ended. A gate that could not decide is a hold.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict, Unpack

from gate.analysis.types import Verdict
from gate.core.database import make_engine, make_sessionmaker, upgrade
from gate.core.errors import DeadlinePassed, GateError, SpecError
from gate.core.settings import Settings
from gate.core.vocabulary import EXIT_ERROR, FinishedState
from gate.engines.lifecycle import Clock
from gate.reservations.allocator import Placement
from gate.reservations.service import GateReservation
from gate.runs import inputs, rows, workloads
from gate.runs.capacity import run_capacity
from gate.runs.context import LiveProgress, RunContext
from gate.runs.correctness_divergence import merge_divergence
from gate.runs.engine_pair import Engines
from gate.runs.heartbeat import Heartbeat, Stops, in_daemon_thread
from gate.runs.journal import persist
from gate.runs.probes import compatibility, correctness, correctness_notes
from gate.runs.progress import NullProgress, Progress
from gate.runs.record import Observed, finish
from gate.runs.reserve import gate_reservation
from gate.runs.scenarios import LoadScenario, bounded
from gate.runs.schedules import GatePlan, plan_gate
from gate.spec import GateSpec, spec_limit_problems
from gate.verdict.document import VerdictDocument


@dataclass
class GateOutcome:
    gate_id: str
    doc: VerdictDocument

    @property
    def document(self) -> dict[str, Any]:
        """The document's JSON form, as stored and served."""
        return self.doc.to_json()

    @property
    def verdict(self) -> str:
        return self.doc.verdict

    @property
    def exit_code(self) -> int:
        return self.doc.exit_code if self.doc.exit_code is not None else EXIT_ERROR


class GateRunner:
    """One gate. `gate_id` names a row the service created (state pending); without it the
    runner creates its own row (the command line)."""

    def __init__(
        self,
        spec: GateSpec,
        settings: Settings,
        report_dir: Path | None = None,
        db_url: str | None = None,
        progress: Progress | None = None,
        gate_id: str = "",
        worker: str | None = None,
        alive: Callable[[], None] | None = None,
    ) -> None:
        """`alive`: called with every heartbeat, a second proof of life (the broker's)."""
        self.spec, self.settings, self.report_dir = spec, settings, report_dir
        self.alive = alive
        self.db_url, self.worker = db_url, worker
        self.gate_id = gate_id or uuid.uuid4().hex
        self.progress = LiveProgress(progress or NullProgress())
        self.stops = Stops()
        self.ctx: RunContext | None = None  # once the database is open
        self.judging = False
        self.outcome: GateOutcome | None = None
        self.stage = "the start"  # where the gate is, for a deadline's message
        self.started = datetime.now(UTC)
        self.clock = Clock()
        self.booking: GateReservation | None = None
        self.tearing_down = False
        self._main: asyncio.Task[Any] | None = None

    def request_stop(self, reason: str) -> bool | None:
        """Stop the run from another task of its loop (a worker shutting down): True when it
        is being stopped, False when it cannot be (judging, finished, stopped already), None
        when it has not begun yet (ask again shortly)."""
        if self.ctx is None or self._main is None:
            return None
        if self.judging or self.outcome is not None or not self.stops.cancel(reason):
            return False
        self._main.cancel()
        return True

    async def run(self) -> GateOutcome:
        engine = make_engine(self.db_url or self.settings.resolved_database_url())
        await asyncio.to_thread(upgrade, engine)
        started = self.started
        factory = make_sessionmaker(engine)
        rows.start_run(factory, self.gate_id, self.spec, started=started, worker=self.worker)
        ctx = RunContext(
            self.gate_id, self.spec, self.settings, factory, self.progress, clock=self.clock
        )
        self.ctx, self._main = ctx, asyncio.current_task()
        ctx.gate_phase("requested")
        seen = Observed(engines=Engines(ctx, None))
        heartbeat = Heartbeat(ctx, self.stops, self._main, self.alive)
        heartbeat.start()
        try:
            result = await self._guarded(ctx, seen, heartbeat)
            doc = finish(ctx, seen, result, started=started, report_dir=self.report_dir)
        finally:
            await heartbeat.join()  # it beat through the teardown and the final write
        self.outcome = GateOutcome(self.gate_id, doc)
        engine.dispose()
        return self.outcome

    async def _guarded(
        self, ctx: RunContext, seen: Observed, heartbeat: Heartbeat
    ) -> tuple[Verdict | None, GateError | None, FinishedState]:
        """The stages under the gate's deadline and heartbeat; teardown whatever happened."""
        deadline_s = ctx.limits.gate_deadline_s(self.spec)
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(deadline_s, self._deadline, deadline_s)
        verdict: Verdict | None = None
        error: GateError | None = None
        state: FinishedState = "complete"
        try:
            verdict = await self._stages(ctx, seen)
        except GateError as exc:
            error, state = exc, "error"
        except asyncio.CancelledError:
            if self.stops.stopped and self._main is not None:
                self._main.uncancel()  # our own cancel (from the API, or the deadline)
            error, state = self.stops.error()
        finally:
            deadline.cancel()
            heartbeat.quiet()
            self.tearing_down = True
            await self._teardown(ctx, seen, state)
        return verdict, error, state

    def _deadline(self, deadline_s: float) -> None:
        """The gate's deadline passed: stop the run where it is (`_guarded` tears down and
        releases), unless a cancel is already stopping it."""
        reason = f"gate deadline of {deadline_s:g} s passed during {self.stage}"
        if self._main is None or self.ctx is None or not self.stops.deadline(reason):
            return
        self.ctx.gate_phase("deadline", reason)
        self._main.cancel()

    def _lease_lost(self, reason: str) -> None:
        """The reservation's lease could expire or is gone: stop now, teardown first (when
        teardown has begun, it goes on; the document says the lease was lost)."""
        if self.tearing_down or self._main is None or self.ctx is None:
            return
        if not self.stops.lease_lost(reason):
            return
        self.ctx.gate_phase("lease_lost", reason)
        self._main.cancel()

    async def _stages(self, ctx: RunContext, seen: Observed) -> Verdict:
        # A stored spec is checked again under the caps of the worker that runs it.
        if over := spec_limit_problems(self.spec, ctx.limits):
            raise SpecError(over, f"gate {self.gate_id}")
        files = workloads.WorkloadFiles.of(ctx.settings, confined=self.worker is not None)
        gplan = plan_gate(self.spec, ctx.limits, files)
        self.stage = "the reservation"
        engines = seen.engines
        assert engines is not None
        engines.placement = await self._reserve(ctx)
        self.stage = "the launch"
        await engines.launch()
        self.stage = "the warm-up"
        await engines.warm_up()
        self.stage = "learning the engines' capabilities"
        await engines.discover()
        await self._scenarios(ctx, seen, engines, gplan)
        self.stage = "judging"
        ctx.gate_phase("judging")
        self.judging = True
        # Off the event loop, so the heartbeat and a cancel or the deadline still act.
        return await in_daemon_thread(
            lambda: self._judge(ctx, seen, gplan), f"gate-judge-{self.gate_id[:8]}"
        )

    async def _reserve(self, ctx: RunContext) -> Placement | None:
        booked = gate_reservation(ctx, lambda why: ctx.gate_phase("waiting_for_capacity", why))
        if booked is None:
            ctx.gate_phase("reserved", "nothing to reserve: both engines are attached")
            return None
        self.booking = booked
        grant = await booked.reserve()
        ctx.gate_phase("reserved", grant.describe())
        booked.start_keep_alive(self._lease_lost)
        return grant.placement

    async def _scenarios(
        self, ctx: RunContext, seen: Observed, engines: Engines, gplan: GatePlan
    ) -> None:
        ctx.notes.extend(correctness_notes(self.spec))
        for sc in self.spec.stages:
            self.stage = f"scenario {sc.name}"
            if sc.is_capacity:
                await run_capacity(ctx, engines, sc, seen.capacity)
            elif sc.suite == "compatibility":
                seen.probes += await bounded(ctx, sc, compatibility(ctx, engines, sc))
            elif sc.suite == "correctness":
                seen.correctness.append(await bounded(ctx, sc, correctness(ctx, engines, sc)))
            else:
                if not seen.scenarios:  # why nothing stops early, said where it applies
                    ctx.notes.extend(gplan.notes)
                result = await LoadScenario(ctx, engines, gplan, sc).run()
                seen.scenarios.append(result)
                if result.overran is not None:
                    raise DeadlinePassed(result.overran)
            if engines.crashes:
                break

    def _judge(self, ctx: RunContext, seen: Observed, gplan: GatePlan) -> Verdict:
        """The verdict on everything the run fed: under the plan the looks used, so a scenario
        stopped early is judged on exactly the prefix its last look saw (early_stop.py)."""
        assert seen.engines is not None
        ran = [r.ran() for r in seen.scenarios]
        found = inputs.judge_inputs(
            {sc.name: sc for sc in self.spec.stages},
            ran,
            seen.engines.evidence(),
            seen.probes,
            self.spec.policy.warmup_requests,
            capacity=seen.capacity,
        )
        divergence = merge_divergence([c.samples for c in seen.correctness])
        plan = gplan.plan if seen.scenarios else None  # fixed for the load that ran
        return inputs.judge_gate(found, self.spec.policy, plan=plan, divergence=divergence)

    async def _teardown(self, ctx: RunContext, seen: Observed, state: FinishedState) -> None:
        booked = self.booking
        assert seen.engines is not None
        await seen.engines.teardown()  # the lease is renewed until the engines are gone
        if booked is not None:
            await booked.stop_keep_alive()
            if booked.grant is not None and seen.engines.placement is None:
                seen.engines.placement = booked.grant.placement  # granted as it was stopped
            released = await persist(
                "the release of the GPUs",
                lambda: booked.release_now(f"gate {state}"),
                ctx.settings.state_write_retry_s,
                ctx.gate_id,
            )
            seen.reservation = booked.describe()
            if released is not None:
                ctx.gate_phase("released", f"reservation {released}")


class RunOptions(TypedDict, total=False):  # run_gate's, passed on; GateRunner has the defaults
    report_dir: Path | None
    db_url: str | None
    progress: Progress | None
    gate_id: str
    worker: str | None


async def run_gate(
    spec: GateSpec, settings: Settings, **options: Unpack[RunOptions]
) -> GateOutcome:
    return await GateRunner(spec, settings, **options).run()
