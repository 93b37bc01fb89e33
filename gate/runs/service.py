"""One gate run, end to end: reserve, launch, mirror load, judge, persist, report, clean up.

The flow is a straight line with one rule: whatever happens (a hold, an engine that never got
ready, an unreachable URL, Ctrl-C) the engines are torn down, the GPUs are released, and the
gate row says how it ended. A gate that could not decide is a hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from gate.analysis.compat import ProbePair, ProbeResult
from gate.analysis.divergence import DivergenceSamples
from gate.analysis.judge import judge
from gate.analysis.load import OverloadPhase, PeakPhase
from gate.analysis.plan import Plan
from gate.analysis.samples import Columns, columns_from_records, select_requests
from gate.analysis.sequential import SequentialJudge
from gate.analysis.types import EngineFacts, ScenarioSamples, Verdict
from gate.core.database import make_engine, make_sessionmaker, transaction, upgrade
from gate.core.errors import DeadlinePassed, EngineError, GateCancelled, GateError, SpecError
from gate.core.limits import Limits, scenario_deadline_s, spec_limit_problems
from gate.core.settings import Settings
from gate.engines.launchers import EndpointEngine, Engine, ProcessEngine
from gate.engines.lifecycle import Clock, CrashInfo, PhaseLog
from gate.models import CheckResult, GatePhase, GateRun, SampleSet
from gate.reports.html import write_report
from gate.reservations import leases
from gate.reservations.allocator import Blocked, Placement
from gate.reservations.inventory import load_inventory
from gate.runs.judging import (
    CorrectnessRun,
    EarlyStop,
    LiveLooks,
    correctness_doc,
    divergence_examples,
    divergence_samples,
    load_phases,
    merge_divergence,
)
from gate.runs.progress import NullProgress, Progress
from gate.spec import (
    MIXED_KUBERNETES_MESSAGE,
    EngineSpec,
    GateSpec,
    ScenarioSpec,
    spec_to_dict,
)
from loadgen import suite as suite_catalogue
from loadgen.client import RequestSpec, Target
from loadgen.metrics import summarize
from loadgen.prompts import synthetic_prompts
from loadgen.records import RequestRecord
from loadgen.runner import Pause, run_paired
from loadgen.schedule import PhasedSchedule, build_offsets

ROLES = ("reference", "candidate")
ENGINE_WARMUP_REQUESTS = 4
CRASH_POLL_S = 0.1

EXIT_CONTINUE, EXIT_HOLD, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130

_T = TypeVar("_T")


@dataclass
class GateOutcome:
    gate_id: str
    document: dict[str, Any]

    @property
    def verdict(self) -> str:
        return str(self.document["verdict"])

    @property
    def exit_code(self) -> int:
        return int(self.document["exit_code"])


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
        block = i // 256
        if self._block[0] != block:
            prompts = synthetic_prompts(
                256, self._sc.prompt_tokens, seed=self._seed * 1_000_003 + block
            )
            self._block = (block, prompts)
        prompt = self._block[1][i % 256]
        return RequestSpec(
            request_id=i, prompt=prompt, max_tokens=self._sc.max_tokens, extra=self._extra
        )


class _Chained(_IndexedRequests):
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


@dataclass
class ScenarioResult:
    name: str
    columns: dict[str, Columns]
    summaries: Mapping[str, Mapping[str, Any]]
    duration_s: float
    aborted: bool
    phases: list[tuple[str, float]] = field(default_factory=list)  # (name, start_s)
    kind: Literal["load", "correctness"] = "load"  # correctness: probes, no load columns
    planned: int | None = None  # requests per arm after the warm-up, when the plan has it
    early_stop: EarlyStop | None = None  # judged on the prefix its last look saw
    looks: int = 0
    overran: str | None = None  # why it was stopped at its deadline, when it was


@dataclass(frozen=True)
class _Schedule:
    """A load scenario's requests and when to send them (offsets, or a concurrency)."""

    requests: Sequence[RequestSpec]
    offsets: np.ndarray | None
    concurrency: int | None
    phases: PhasedSchedule | None
    n: int  # an open-ended closed loop: the most it may send (the per-scenario cap)
    open_ended: bool = False  # a closed loop for a duration: its size is not known in advance

    @property
    def planned_s(self) -> float | None:
        """Seconds of load it plans (the last send; a phased schedule's phases), or None
        when that is not known in advance (a closed loop of a number of requests)."""
        if self.phases is not None:
            return self.phases.duration_s
        if self.offsets is not None:
            return float(self.offsets[-1]) if self.offsets.size else 0.0
        return None


class _LiveProgress:
    """Forwards progress to the caller's sink and keeps the latest state for the heartbeat,
    which writes it to the gate row (what the API and the live report page show)."""

    def __init__(self, inner: Progress) -> None:
        self.inner = inner
        self.state: dict[str, Any] = {}

    def phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None:
        self.inner.phase(role, phase, at_s, detail)

    def scenario_started(self, name: str, total: int) -> None:
        self.state = {"scenario": name, "done": 0, "total": total}
        self.inner.scenario_started(name, total)

    def request_done(self, name: str, done: int, total: int) -> None:
        self.state = {"scenario": name, "done": done, "total": total}
        self.inner.request_done(name, done, total)

    def scenario_finished(self, name: str) -> None:
        self.state = {**self.state, "finished": True}
        self.inner.scenario_finished(name)


@dataclass
class GateRunner:
    """One gate. `gate_id` names a row the service created (state pending); without it the
    runner creates its own row (the command line)."""

    spec: GateSpec
    settings: Settings
    report_dir: Path | None = None
    db_url: str | None = None
    progress: Progress = field(default_factory=NullProgress)
    gate_id: str = ""
    worker: str | None = None

    def __post_init__(self) -> None:
        self.gate_id = self.gate_id or uuid.uuid4().hex
        self.live = _LiveProgress(self.progress)
        self.progress = self.live
        self.cancel_reason: str | None = None
        self.clock = Clock()
        self.factory: sessionmaker[Session] | None = None
        self.engines: dict[str, Engine] = {}
        self.grant: leases.Grant | None = None
        self.crashes: list[CrashInfo] = []
        self.results: list[ScenarioResult] = []
        self.started = datetime.now(UTC)
        self.phase_rows: list[tuple[str, str, float, str | None]] = []
        self.outcome: GateOutcome | None = None
        self.probes: list[ProbePair] = []
        self.probe_doc: list[dict[str, Any]] = []
        self.blocked: Blocked | None = None
        self.plan: Plan | None = None  # fixed before the first scenario runs (_fix_plan)
        self.plan_fixed = False
        self.schedules: dict[str, _Schedule] = {}
        self.run_notes: list[str] = []  # the run's own notes for the verdict document
        self.correctness: list[CorrectnessRun] = []
        self.divergence: list[DivergenceSamples] = []
        self.limits = Limits.from_settings(self.settings)
        self.stage = "the start"  # where the gate is, for a deadline's message
        self.deadline_reason: str | None = None  # set when the gate's deadline passed
        self._stopping = threading.Lock()  # one of cancel and deadline stops the run, not both

    # -- bookkeeping -------------------------------------------------------------------------

    def _db(self) -> sessionmaker[Session]:
        assert self.factory is not None
        return self.factory

    def _phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None:
        self.phase_rows.append((role, phase, at_s, detail))
        self.progress.phase(role, phase, at_s, detail)
        if self.factory is not None:
            with transaction(self.factory) as s:
                s.add(
                    GatePhase(
                        gate_id=self.gate_id, role=role, phase=phase, at_s=at_s, detail=detail
                    )
                )
                run = s.get(GateRun, self.gate_id)
                if run is not None:
                    run.phase = phase if role == "gate" else f"{role}:{phase}"

    def gate_phase(self, phase: str, detail: str | None = None) -> None:
        self._phase("gate", phase, self.clock.now_s(), detail)

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> GateOutcome:
        url = self.db_url or self.settings.resolved_database_url()
        engine = make_engine(url)
        await asyncio.to_thread(upgrade, engine)
        self.factory = make_sessionmaker(engine)
        with transaction(self.factory) as s:
            run = s.get(GateRun, self.gate_id)
            if run is None:
                run = GateRun(id=self.gate_id, name=self.spec.name, spec=spec_to_dict(self.spec))
                s.add(run)
            run.state = "running"
            run.phase = "created"
            run.started_at = self.started
            run.worker = self.worker
            run.heartbeat_at = self.started
            run.attempts = (run.attempts or 0) + 1
            run.reference_label = self.spec.reference.label
            run.candidate_label = self.spec.candidate.label
        self.gate_phase("requested")
        verdict: Verdict | None = None
        error: GateError | None = None
        state = "complete"
        heartbeat: asyncio.Task[None] | None = None
        me = asyncio.current_task()
        stop_beating = threading.Event()
        liveness = threading.Thread(
            target=self._liveness,
            args=(asyncio.get_running_loop(), me, stop_beating),
            name=f"gate-heartbeat-{self.gate_id[:8]}",
            daemon=True,
        )
        liveness.start()
        deadline_s = self.limits.gate_deadline_s(self.spec)
        deadline = asyncio.get_running_loop().call_later(deadline_s, self._deadline, me, deadline_s)
        try:
            # A stored spec is checked again under the caps of the worker that runs it.
            if over := spec_limit_problems(self.spec, self.limits):
                raise SpecError(over, f"gate {self.gate_id}")
            self.stage = "the reservation"
            self.grant = await self._reserve_or_wait()
            if self.grant is not None:
                self.gate_phase("reserved", self.grant.describe())
                heartbeat = asyncio.create_task(self._heartbeat())
            else:
                self.gate_phase("reserved", "nothing to reserve: both engines are attached")
            self.stage = "the launch"
            await self._launch_all()
            self.stage = "the warm-up"
            await self._warm_up()
            for scenario in self.spec.scenarios:
                self.stage = f"scenario {scenario.name}"
                if scenario.suite == "compatibility":
                    await self._bounded(scenario, self._run_probes(scenario))
                else:
                    result = await self._run_scenario(scenario)
                    self.results.append(result)
                    if result.overran is not None:
                        raise DeadlinePassed(result.overran)
                if self.crashes:
                    break
            self.stage = "judging"
            self.gate_phase("judging")
            # Off the event loop, so the heartbeat and a cancel or the deadline still act.
            verdict = await _in_daemon_thread(self._judge, f"gate-judge-{self.gate_id[:8]}")
        except GateError as exc:
            error, state = exc, "error"
        except asyncio.CancelledError:
            if (self.cancel_reason or self.deadline_reason) is not None and me is not None:
                me.uncancel()  # our own cancel (from the API, or the deadline), handled here
            if self.deadline_reason is not None and self.cancel_reason is None:
                error, state = DeadlinePassed(self.deadline_reason), "error"
            else:
                error, state = (
                    GateCancelled(
                        self.cancel_reason or "the gate was interrupted before it could decide"
                    ),
                    "cancelled",
                )
        finally:
            deadline.cancel()
            stop_beating.set()
            if heartbeat is not None:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await heartbeat
            await self._teardown(state)
            await asyncio.to_thread(liveness.join, 10.0)
        self.outcome = self._finish(verdict, error, state)
        engine.dispose()
        return self.outcome

    def _deadline(self, main: asyncio.Task[Any] | None, deadline_s: float) -> None:
        """The gate's deadline passed: stop the run where it is (the `finally` of `run` tears
        down and releases), unless a cancel is already stopping it."""
        with self._stopping:
            if main is None or self.cancel_reason is not None or self.deadline_reason is not None:
                return
            self.deadline_reason = f"gate deadline of {deadline_s:g} s passed during {self.stage}"
        self.gate_phase("deadline", self.deadline_reason)
        main.cancel()

    async def _reserve_or_wait(self) -> leases.Grant | None:
        """Reserve now, or, when the block is one that waiting can lift and the shape allows
        it (`shape.wait_s`), retry until the deadline; the last blocked reason ends the gate."""
        deadline = time.monotonic() + self.spec.shape.wait_s
        delay = 1.0
        announced = False
        while True:
            attempt = asyncio.ensure_future(asyncio.to_thread(self._reserve))
            try:
                return await asyncio.shield(attempt)
            except asyncio.CancelledError:
                # Stopped (a cancel, the deadline) while the thread reserves: a grant it still
                # gets is ours to release, in the run's teardown.
                with contextlib.suppress(Exception):
                    self.grant = await attempt
                raise
            except leases.BlockedReservation as exc:
                self.blocked = exc.blocked
                if not exc.blocked.retryable or time.monotonic() + delay > deadline:
                    raise
                if not announced:
                    self.gate_phase("waiting_for_capacity", f"{exc.blocked.code}: {exc.message}")
                    announced = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 15.0)

    def _reserve(self) -> leases.Grant | None:
        launched = ("process", "kubernetes")
        roles = tuple(r for r in ROLES if getattr(self.spec, r).kind in launched)
        if not roles:
            return None  # both engines are attached endpoints: their GPUs are not ours to hold
        pods = [k for r in roles if (k := getattr(self.spec, r).kubernetes) is not None]
        if pods and len(pods) != len(roles):
            raise GateError(MIXED_KUBERNETES_MESSAGE)  # parse_spec refuses it; a guard
        if pods:
            # The cluster's nodes (or the spec's inventory file), after reaping the Leases of
            # gates that died without teardown, which frees the GPUs their pods held. Imported
            # here: the kubernetes client takes a second to import, which other gates skip.
            from gate.engines.kubernetes import cluster_inventory, connect, reap_namespaces

            k = pods[0]
            api_client, cluster = connect(
                kubeconfig=k.kubeconfig, context=k.context, in_cluster=k.in_cluster
            )
            with api_client:
                reap_namespaces(api_client, (p.namespace for p in pods))
                if self.spec.inventory:
                    inventory = load_inventory(self.spec.inventory)
                else:
                    inventory = cluster_inventory(api_client, k.cluster or cluster)
        else:
            inventory = load_inventory(self.spec.inventory or self.settings.inventory)
        shape = self.spec.shape.request(roles)
        return leases.reserve(
            self._db(),
            inventory,
            shape,
            holder=f"gate:{self.gate_id}",
            gate_id=self.gate_id,
            ttl_s=self.settings.lease_ttl_s,
        )

    def _liveness(
        self,
        loop: asyncio.AbstractEventLoop,
        main: asyncio.Task[Any] | None,
        stop: threading.Event,
    ) -> None:
        """The gate's own heartbeat, on its own thread: it proves the worker process is alive
        (a gate whose heartbeat stops is ended by the reaper) even while the event loop is busy
        (building a 100k-request schedule, judging), publishes progress, and obeys a cancel
        request by cancelling the run on its loop."""
        while not stop.wait(self.settings.heartbeat_s):
            try:
                cancel = self._beat()
            except Exception:  # a database hiccup must not kill the run; the next beat retries
                continue
            if cancel is not None and self.cancel_reason is None and main is not None:
                with self._stopping:
                    if self.deadline_reason is not None:
                        return  # the deadline is stopping it already
                    self.cancel_reason = cancel
                loop.call_soon_threadsafe(main.cancel)
                return

    def _beat(self) -> str | None:
        """Write the heartbeat; return why the gate must stop, if it must."""
        with transaction(self._db()) as s:
            run = s.get(GateRun, self.gate_id)
            if run is None:
                return "the gate's record was deleted"
            if run.state != "running":  # the reaper ended it: our worker looked lost
                return f"the gate was ended elsewhere while running ({run.reason})"
            run.heartbeat_at = datetime.now(UTC)
            run.progress = dict(self.live.state) or None
            if run.cancel_requested:
                return run.reason or "cancelled on request before the gate could decide"
            return None

    async def _heartbeat(self) -> None:
        assert self.grant is not None
        period = max(1.0, self.settings.lease_ttl_s / 3)
        while True:
            await asyncio.sleep(period)
            await asyncio.to_thread(
                leases.heartbeat, self._db(), self.grant.reservation_id, self.settings.lease_ttl_s
            )

    def _make_engine(self, role: str, es: EngineSpec, placement: Placement | None) -> Engine:
        phases = PhaseLog(role, self.clock, self._phase)
        if es.url is not None:
            return EndpointEngine(
                role=role,
                base_url=es.url,
                model=self.spec.model,
                phases=phases,
                readiness_timeout_s=es.readiness_timeout_s,
                allow=list(self.settings.engine_url_allow) if es.caller_url else None,
            )
        k = es.kubernetes
        if k is not None:
            from gate.engines.kubernetes import GateLease, KubernetesEngine, connect
            from gate.engines.manifests import EngineWorkload

            if placement is None:  # _reserve reserves for every kubernetes engine
                raise EngineError(role, "launched", "a kubernetes engine needs reserved GPUs")
            # One cluster per gate (the spec checks it): one client, one Lease per namespace.
            pods = [e for e in self.engines.values() if isinstance(e, KubernetesEngine)]
            if pods:
                api_client = pods[0].api_client
            else:
                api_client, _ = connect(
                    kubeconfig=k.kubeconfig, context=k.context, in_cluster=k.in_cluster
                )
            lease = next((e.lease for e in pods if e.workload.namespace == k.namespace), None)
            try:
                workload = EngineWorkload.from_placement(
                    placement.for_role(role),
                    namespace=k.namespace,
                    gate_id=self.gate_id,
                    image=k.image,
                    model=self.spec.model,
                    command=tuple(k.command),
                    args=tuple(k.args),
                    worker_command=None if k.worker_command is None else tuple(k.worker_command),
                    worker_args=None if k.worker_args is None else tuple(k.worker_args),
                    port=k.port,
                    env=dict(k.env),
                    secret_env={name: (r.secret, r.key) for name, r in k.secret_env.items()},
                    tolerate=tuple(k.tolerate),
                    cpu=k.cpu,
                    memory=k.memory,
                    shm_size=k.shm_size,
                    image_pull_policy=k.image_pull_policy,
                    image_pull_secrets=tuple(k.image_pull_secrets),
                    service_account=k.service_account,
                    health_path=k.health_path,
                )
            except ValueError as exc:
                raise EngineError(role, "launched", f"cannot be rendered: {exc}") from None
            return KubernetesEngine(
                workload,
                phases,
                api_client,
                lease=lease or GateLease(api_client, namespace=k.namespace, gate_id=self.gate_id),
                readiness_timeout_s=es.readiness_timeout_s,
            )
        log_dir = self.settings.data_dir / "logs" / self.gate_id
        return ProcessEngine(
            role=role,
            argv_template=es.argv_template(),
            model=self.spec.model,
            phases=phases,
            log_path=log_dir / f"{role}.log",
            placement=placement.for_role(role) if placement else None,
            env=dict(es.env),
            cwd=es.cwd,
            readiness_timeout_s=es.readiness_timeout_s,
        )

    async def _launch_all(self) -> None:
        placement = self.grant.placement if self.grant else None
        for role in ROLES:
            self.engines[role] = self._make_engine(role, getattr(self.spec, role), placement)
        tasks = [asyncio.create_task(self.engines[r].start()) for r in ROLES]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:  # the first failure in role order names the engine that blocked
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    def _targets(self, scenario_api: str) -> list[Target]:
        return [
            Target(
                name=role,
                base_url=self.engines[role].base_url,
                api=scenario_api,  # type: ignore[arg-type]
                model=self.spec.model,
            )
            for role in ROLES
        ]

    async def _warm_up(self) -> None:
        """A few requests per engine before any measurement: first-request costs (lazy
        compilation, CUDA graph capture, connection set-up) are not what we compare."""
        first = self.spec.scenarios[0]
        reqs = LazyRequests(first, seed=self.spec.seed + 7_919, length=ENGINE_WARMUP_REQUESTS)
        result = await run_paired(self._targets(first.api), reqs, concurrency=2)
        failed = [(role, r) for role, recs in result.records.items() for r in recs if r.error_kind]
        self._check_crashes()
        if self.crashes:
            c = self.crashes[0]
            raise GateError(f"{c.summary()} during warm-up")
        for role in ROLES:
            self.engines[role].phases.mark("warmup_done")
            self.engines[role].phases.mark("ready")
        if failed:
            role, rec = failed[0]
            self.gate_phase(
                "warmup_errors",
                f"{len(failed)} warm-up requests failed; first: "
                f"{role} {rec.error_kind}: {rec.error_message}",
            )

    def _check_crashes(self) -> None:
        seen = {c.role for c in self.crashes}
        for role in ROLES:
            eng = self.engines.get(role)
            if eng is None or role in seen:
                continue
            crash = eng.crashed()
            if crash is not None:
                self.crashes.append(crash)
                self._phase(role, "crashed", crash.at_s, crash.description)

    async def _watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            before = len(self.crashes)
            self._check_crashes()
            if len(self.crashes) > before:
                stop.set()
                return
            await asyncio.sleep(CRASH_POLL_S)

    async def _bounded(self, sc: ScenarioSpec, work: Coroutine[Any, Any, _T]) -> _T:
        """A probe suite under its deadline: probes have no planned duration, so the deadline
        is reckoned from the cap on one (gate/core/limits.py); past it the probes are
        cancelled and the gate holds naming the deadline."""
        limit_s = scenario_deadline_s(None, self.limits)
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
        why = _planned_words(None, self.limits)
        raise DeadlinePassed(f"scenario {sc.name} passed its deadline of {limit_s:g} s ({why})")

    async def _run_probes(self, sc: ScenarioSpec) -> None:
        """The compatibility suite: the same fixed probe set to both engines, one probe at a
        time; a probe the reference answers well and the candidate does not fails a check."""
        self.gate_phase(f"scenario:{sc.name}", "compatibility probes")
        targets = self._targets(sc.api)
        cap = self.limits.max_prompt_tokens  # the operator's, not the engine's, context
        ref, cand = await asyncio.gather(
            *(suite_catalogue.run_probes(t, max_context=cap) for t in targets)
        )
        self._check_crashes()
        by_name = {p.name: p for p in cand}
        for r in ref:
            c = by_name.get(r.name)
            if c is None:
                continue
            self.probes.append(ProbePair(r.name, _probe(r), _probe(c)))
            self.probe_doc.append(
                {
                    "name": r.name,
                    "reference": {"status": r.status, "ok": r.ok, "problems": r.problems},
                    "candidate": {"status": c.status, "ok": c.ok, "problems": c.problems},
                }
            )

    def _schedule(self, sc: ScenarioSpec) -> _Schedule:
        """A load scenario's requests and send times, built once (the plan needs every
        scenario's size before the first one runs)."""
        cached = self.schedules.get(sc.name)
        if cached is not None:
            return cached
        seed = self.spec.seed * 7_777 + self.spec.scenarios.index(sc)
        offsets: np.ndarray | None = None
        concurrency: int | None = None
        phases: PhasedSchedule | None = None
        reqs: Sequence[RequestSpec]
        open_ended = False
        if sc.suite is not None:
            built = suite_catalogue.get(sc.suite, **sc.settings).build(seed=seed)
            reqs, offsets, concurrency, phases = (
                built.requests,
                built.offsets_s,
                built.concurrency,
                built.phases,
            )
            n = len(reqs)
        elif sc.arrival == "concurrency":
            concurrency = sc.concurrency
            open_ended = sc.requests is None
            # A closed loop for a duration ends at its duration or at the cap, what comes first.
            n = self.limits.max_scenario_requests if sc.requests is None else sc.requests
        else:
            assert sc.rate is not None
            offsets = build_offsets(
                sc.arrival,
                sc.rate,
                requests=sc.requests,
                duration_s=sc.duration_s,
                burstiness=sc.burstiness,
                seed=seed,
            )
            n = int(offsets.size)
        if sc.suite is None:
            reqs = LazyRequests(sc, seed=seed, length=n)
        out = _Schedule(reqs, offsets, concurrency, phases, n, open_ended)
        self.schedules[sc.name] = out
        return out

    def _fix_plan(self) -> None:
        """Fix every load scenario's checks, tunings and alphas before the first sample
        (analysis/plan.py), from the schedules' sizes alone. Without a plan (a scenario whose
        size is not known in advance) nothing stops early and the judge looks once, at the
        end."""
        if self.plan_fixed:
            return
        self.plan_fixed = True
        warm = self.spec.policy.warmup_requests
        sizes: dict[str, int] = {}
        for sc in self.spec.scenarios:
            if sc.is_probe:
                continue
            sched = self._schedule(sc)
            n = sched.n
            if sched.open_ended:
                self.run_notes.append(
                    f"No early stop in this gate: {sc.name} runs closed loop for a duration, so "
                    "its size is not known in advance; each scenario was judged once, at its end."
                )
                return
            if n <= warm:
                self.run_notes.append(
                    f"No early stop in this gate: {sc.name} has {n} requests, none left after "
                    f"the {warm}-request warm-up."
                )
                return
            sizes[sc.name] = n - warm
        if sizes:
            extendable = {
                sc.name
                for sc in self.spec.scenarios
                if sc.name in sizes and self._extendable(sc, self._schedule(sc))
            }
            self.plan = Plan.build(self.spec.policy, sizes, extendable)

    @staticmethod
    def _extendable(sc: ScenarioSpec, sched: _Schedule) -> bool:
        """Steady open-loop load may run on past its plan (policy `extend`); phased load
        (peak, overload, recovery) has a shape that more requests would change."""
        return (
            sched.offsets is not None
            and sched.phases is None
            and sc.suite in (None, "normal")
            and sched.n >= 2
        )

    def _extended(self, sc: ScenarioSpec, sched: _Schedule, extra: int) -> _Schedule:
        """The schedule with `extra` more requests after it: the same arrival process at the
        same mean rate, new prompts (another seed, so no prefix cache flatters them)."""
        assert sched.offsets is not None and extra > 0
        seed = (self.spec.seed * 7_777 + self.spec.scenarios.index(sc)) * 2 + 1_000_001
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
        last = float(sched.offsets[-1])
        gap = last / (sched.n - 1) if last > 0 else 0.0
        joined = np.concatenate([sched.offsets, offsets + last + gap])
        return _Schedule(_Chained(sched.requests, more), joined, None, None, sched.n + extra)

    def _looks(self, sc: ScenarioSpec, stop: asyncio.Event) -> LiveLooks | None:
        if self.plan is None or sc.name not in self.plan.requests:
            return None
        policy = self.spec.policy

        def stopped(early: EarlyStop) -> None:
            self.gate_phase("early_stop" if early.reason != "planned" else "stop", early.message)
            stop.set()

        return LiveLooks(
            judge=SequentialJudge(self.plan),
            scenario=sc.name,
            warmup=policy.warmup_requests,
            look_every=policy.look_every,
            zero_ns=time.monotonic_ns(),
            on_stop=stopped,
            # Goodput, collapse and recovery are judged at the end; the looks do not see them,
            # so such a scenario stops early only on a hold, which they could not undo.
            hold_only=sc.suite in ("peak", "overload", "recovery"),
        )

    async def _run_scenario(self, sc: ScenarioSpec) -> ScenarioResult:
        if sc.suite == "correctness":
            return await self._bounded(sc, self._run_correctness(sc))
        self._fix_plan()
        sched = self._schedule(sc)
        n, phases = sched.n, sched.phases
        total = 0 if sched.open_ended else n
        if sched.open_ended:
            detail = f"up to {n} requests in {sc.duration_s:g} s"
        else:
            detail = f"{n} requests"
        pause: Pause | None = None
        if self.plan is not None and sc.name in self.plan.requests:
            extra = self.plan.limit(sc.name) - self.plan.requests[sc.name]
            if extra > 0:
                # The schedule pauses after the planned requests until the look at the planned
                # size says whether the extension runs: no extension request is sent unjudged.
                pause = Pause(n, asyncio.get_running_loop().create_future())
                sched = self._extended(sc, sched, extra)
                detail += f" (up to {sched.n} while a check is undecided)"
        self.gate_phase(f"scenario:{sc.name}", detail)
        self.progress.scenario_started(sc.name, total * len(ROLES))
        stop = asyncio.Event()
        looks = self._looks(sc, stop)
        if pause is not None:
            if looks is not None:
                looks.go = pause.go
            else:  # nothing would ever decide: the plan's size is the end
                pause.go.set_result(False)
        done = 0

        def on_record(rec: RequestRecord) -> None:
            nonlocal done, total
            done += 1
            if done > total * len(ROLES) and total:
                total = sched.n  # running on into the extension
            self.progress.request_done(sc.name, done, total * len(ROLES))
            if looks is not None:
                looks.add(rec)

        watcher = asyncio.create_task(self._watch(stop))
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        if sc.arrival == "concurrency" and sc.duration_s is not None:
            timer = loop.call_later(sc.duration_s, stop.set)
        # Its deadline (gate/core/limits.py), from what it plans after any extension: past it
        # the scenario stops like a crash stops it, keeping what finished, and the gate holds.
        planned_s = sc.duration_s if sched.open_ended else sched.planned_s
        limit_s = scenario_deadline_s(planned_s, self.limits)
        overran: list[str] = []

        def overrun() -> None:
            why = _planned_words(planned_s, self.limits)
            overran.append(f"scenario {sc.name} passed its deadline of {limit_s:g} s ({why})")
            stop.set()

        overdue = loop.call_later(limit_s, overrun)
        t0 = time.monotonic()
        try:
            result = await run_paired(
                self._targets(sc.api),
                sched.requests,
                offsets_s=sched.offsets,
                concurrency=sched.concurrency,
                on_record=on_record,
                stop=stop,
                pause=pause,
            )
        finally:
            aborted = stop.is_set() and (bool(self.crashes) or bool(overran))
            overdue.cancel()
            stop.set()
            if timer is not None:
                timer.cancel()
            await watcher
            if looks is not None:
                await looks.close()
        duration = time.monotonic() - t0
        self._check_crashes()
        self.progress.scenario_finished(sc.name)
        phase_of = phases.phase_index if phases is not None else None
        columns = {
            role: columns_from_records(result.records.get(role, []), result.start_ns, phase_of)
            for role in ROLES
        }
        summaries = {role: summarize(result.records.get(role, []), duration) for role in ROLES}
        marks = (
            [(p.name, s) for p, s in zip(phases.phases, phases.starts_s, strict=True)]
            if phases is not None
            else []
        )
        return ScenarioResult(
            sc.name,
            columns,
            summaries,
            duration,
            aborted,
            marks,
            planned=self.plan.requests.get(sc.name) if self.plan is not None else None,
            early_stop=looks.stopped if looks is not None else None,
            looks=looks.looks if looks is not None else 0,
            overran=overran[0] if overran else None,
        )

    async def _run_correctness(self, sc: ScenarioSpec) -> ScenarioResult:
        """The correctness suite: greedy probes with logprobs on both engines, one at a time;
        the same probes on the reference again, all at once beside `envelope_load` other
        requests (the reference's own envelope, alone against under load); and, where the
        engines do prompt_logprobs, the reference's continuations scored by both engines and
        by the reference under load (teacher-forced). Judged in judging.divergence_samples."""
        cfg = suite_catalogue.get("correctness", **sc.settings)
        assert isinstance(cfg, suite_catalogue.Correctness)
        seed = self.spec.seed * 7_777 + self.spec.scenarios.index(sc)
        self.gate_phase(f"scenario:{sc.name}", f"{cfg.probes_count} correctness probes")
        ref_t, cand_t = self._targets("completions")
        t0 = time.monotonic()
        ref, cand = await asyncio.gather(
            suite_catalogue.run_correctness(ref_t, scenario=cfg, seed=seed),
            suite_catalogue.run_correctness(cand_t, scenario=cfg, seed=seed),
        )
        loaded = await suite_catalogue.run_correctness(
            ref_t, scenario=cfg, seed=seed, concurrent=True, background=cfg.envelope_load
        )
        run = CorrectnessRun(sc.name, cfg.max_tokens, ref, cand, loaded)
        if cfg.teacher_forced:
            run.scored = [i for i, r in enumerate(ref) if r.prompt_token_ids and r.token_ids]
            items = [(ref[i].prompt_token_ids or [], ref[i].token_ids or []) for i in run.scored]
            if items:
                k = cfg.top_logprobs
                s_ref, s_cand = await asyncio.gather(
                    suite_catalogue.score_continuations(ref_t, items, top_logprobs=k),
                    suite_catalogue.score_continuations(cand_t, items, top_logprobs=k),
                )
                s_load = await suite_catalogue.score_continuations(
                    ref_t,
                    items,
                    top_logprobs=k,
                    concurrent=True,
                    background=cfg.envelope_load,
                    scenario=cfg,
                    seed=seed,
                )
                run.scores = {"reference": s_ref, "candidate": s_cand, "loaded": s_load}
            elif any(r.error is None for r in ref):
                self.run_notes.append(
                    f"Teacher-forced scoring in {sc.name} skipped: the reference returns no "
                    "prompt and output token ids (vLLM's return_token_ids); free-run greedy only."
                )
        self._check_crashes()
        self.correctness.append(run)
        self.divergence.append(divergence_samples(run, self.run_notes))
        empty = columns_from_records([], 0)
        return ScenarioResult(
            sc.name,
            dict.fromkeys(ROLES, empty),
            {role: {} for role in ROLES},
            time.monotonic() - t0,
            bool(self.crashes),
            kind="correctness",
        )

    def _judge(self) -> Verdict:
        """The verdict on everything the run fed: under the plan the looks used, so a scenario
        stopped early is judged on exactly the prefix its last look saw (the same sequences
        give the same decisions; judging.py); load phases; the correctness suite's pairs."""
        warm = self.spec.policy.warmup_requests
        specs = {s.name: s for s in self.spec.scenarios}
        scenarios: list[ScenarioSamples] = []
        peaks: list[PeakPhase] = []
        overloads: list[OverloadPhase] = []
        for r in self.results:
            if r.kind != "load":
                continue
            upto = r.early_stop.upto if r.early_stop is not None else None
            ref = select_requests(r.columns["reference"], warm, upto)
            cand = select_requests(r.columns["candidate"], warm, upto)
            scenarios.append(ScenarioSamples(r.name, ref.to_arm(), cand.to_arm()))
            sc = specs[r.name]
            p, o = load_phases(r.name, sc.suite, sc.settings, ref, cand, r.phases)
            peaks.extend(p)
            overloads.extend(o)
        facts = []
        for role in ROLES:
            eng = self.engines[role]
            crash = next((c for c in self.crashes if c.role == role), None)
            ready = _ready_s(eng)
            facts.append(
                EngineFacts(
                    role=role,  # type: ignore[arg-type]
                    ready_s=ready,
                    crashed=crash is not None,
                    crash_detail=_crash_detail(crash) if crash else None,
                    phases=_phase_durations(eng.phases.reached) if ready is not None else {},
                )
            )
        return judge(
            scenarios,
            facts,
            self.spec.policy,
            plan=self.plan,
            peaks=peaks,
            overloads=overloads,
            probes=self.probes,
            divergence=merge_divergence(self.divergence),
        )

    async def _teardown(self, state: str) -> None:
        for role in ROLES:
            eng = self.engines.get(role)
            if eng is None:
                continue
            try:
                await asyncio.shield(eng.stop())
            except BaseException:  # a second Ctrl-C: fall back to SIGKILL, synchronously
                kill = getattr(eng, "kill_now", None)
                if kill is not None:
                    kill()
            if eng.launched:
                eng.phases.mark("stopped")
        if self.grant is not None:
            await asyncio.to_thread(
                leases.release, self._db(), self.grant.reservation_id, f"gate {state}"
            )
            self.gate_phase("released", f"reservation {self.grant.reservation_id}")

    # -- results -----------------------------------------------------------------------------

    def _finish(self, verdict: Verdict | None, error: GateError | None, state: str) -> GateOutcome:
        finished = datetime.now(UTC)
        report_dir = self.report_dir or (self.settings.data_dir / "reports")
        report_dir.mkdir(parents=True, exist_ok=True)
        report_path = (report_dir / f"{self.spec.name}-{self.gate_id[:8]}.html").resolve()
        if verdict is not None:
            decision = verdict.decision
            vdict = verdict.to_dict()
            checks = vdict["checks"]
            reasons = [{"check": c["id"], "message": c["message"]} for c in vdict["reasons"]]
            notes = list(vdict.get("notes", []))
            notes += [r.early_stop.message for r in self.results if r.early_stop is not None]
            notes += self.run_notes
            exit_code = 0 if decision == "continue" else EXIT_HOLD
        else:
            assert error is not None
            decision = "hold"
            checks = []
            reasons = [{"check": f"gate.{error.code}", "message": error.message}]
            notes = ["The gate could not finish, so it cannot vouch for the candidate: hold."]
            exit_code = EXIT_INTERRUPTED if state == "cancelled" else EXIT_ERROR
        loads = [r for r in self.results if r.kind == "load"]
        document: dict[str, Any] = {
            "gate_id": self.gate_id,
            "name": self.spec.name,
            "model": self.spec.model,
            "state": state,
            "verdict": decision,
            "reasons": reasons,
            "checks": checks,
            "notes": notes,
            "report": str(report_path),
            "document": str(report_path.with_suffix(".json")),
            "error": {"code": error.code, "message": error.message} if error else None,
            "engines": self._engines_doc(),
            "reservation": self._reservation_doc(),
            "scenarios": [
                {
                    "name": r.name,
                    "duration_s": round(r.duration_s, 3),
                    "aborted": r.aborted,
                    "phases": [{"name": n, "start_s": round(s, 3)} for n, s in r.phases],
                    "reference": r.summaries["reference"],
                    "candidate": r.summaries["candidate"],
                    "planned_requests": r.planned,
                    "looks": r.looks,
                    "early_stop": r.early_stop.to_doc() if r.early_stop is not None else None,
                }
                for r in loads
            ],
            "probes": self.probe_doc,
            "correctness": [
                correctness_doc(run, data)
                for run, data in zip(self.correctness, self.divergence, strict=True)
            ],
            "divergence_examples": [
                ex for run in self.correctness for ex in divergence_examples(run, self.spec.policy)
            ][:5],
            "started_at": self.started.isoformat(),
            "finished_at": finished.isoformat(),
            "duration_s": round(self.clock.now_s(), 3),
            "exit_code": exit_code,
        }
        write_report(
            document,
            {r.name: r.columns for r in loads},
            report_path,
            warmup=self.spec.policy.warmup_requests,
        )
        self._persist(document, verdict, state, finished, str(report_path))
        return GateOutcome(self.gate_id, document)

    def _engines_doc(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for role in ROLES:
            es: EngineSpec = getattr(self.spec, role)
            eng = self.engines.get(role)
            crash = next((c for c in self.crashes if c.role == role), None)
            phases = eng.phases.reached if eng else {}
            ready_s = _ready_s(eng) if eng else None
            ready = round(ready_s, 3) if ready_s is not None else None
            placement: dict[str, Any] | None = None
            if self.grant is not None and es.kind in ("process", "kubernetes"):
                p = self.grant.placement.for_role(role)
                placement = {"node": p.node, "gpus": list(p.gpus), "sku": p.sku}
                if es.kind == "kubernetes":
                    placement["nodes"] = [{"node": n, "gpus": list(g)} for n, g in p.nodes]
                    placement["domain"] = p.domain
            kube: dict[str, Any] | None = None
            if es.kind == "kubernetes":
                from gate.engines.kubernetes import KubernetesEngine

                if isinstance(eng, KubernetesEngine):
                    w, made = eng.workload, eng.manifests
                    objects = [] if made is None else made.objects
                    kube = {
                        "namespace": w.namespace,
                        "image": w.image,
                        "workload": f"{'LeaderWorkerSet' if w.multi_node else 'Pod'} {w.name}",
                        "clique": w.clique,
                        "service_url": eng.service_url,
                        "lease": eng.lease.name if eng.lease else None,
                        "objects": [
                            f"{m['kind']} {w.namespace}/{m['metadata']['name']}" for m in objects
                        ],
                    }
            out[role] = {
                "kind": es.kind,
                "url": eng.base_url if eng else es.url,
                "pid": eng.pid if eng else None,
                "placement": placement,
                "kubernetes": kube,
                "phases": {k: round(v, 3) for k, v in phases.items()},
                "ready_s": ready,
                "crash": None
                if crash is None
                else {
                    "at_s": round(crash.at_s, 3),
                    "exit_code": crash.exit_code,
                    "description": crash.description,
                    "log_tail": list(crash.log_tail),
                },
                "log": str(eng.log_path) if isinstance(eng, ProcessEngine) else None,
                "log_tail": eng.log_tail(30) if eng else [],
            }
        return out

    def _reservation_doc(self) -> dict[str, Any] | None:
        if self.grant is None:
            if self.blocked is None:
                return None
            b = self.blocked
            return {
                "state": "blocked",
                "code": b.code,
                "message": b.message,
                "retryable": b.retryable,
                "eliminated": b.eliminated,
                "per_domain": [f._asdict() for f in b.per_domain[:50]],
            }
        return {
            "state": "released",
            "id": self.grant.reservation_id,
            "fence": self.grant.reservation_id,
            "placement": leases.placement_to_json(self.grant.placement),
        }

    def _persist(
        self,
        document: dict[str, Any],
        verdict: Verdict | None,
        state: str,
        finished: datetime,
        report: str,
    ) -> None:
        with transaction(self._db()) as s:
            run = s.get(GateRun, self.gate_id, with_for_update=True)
            assert run is not None
            if run.state in ("complete", "error", "cancelled"):
                # A reaper ended it while it ran (its heartbeat looked lost): that verdict and
                # reason stand; the document says what the run saw before it stopped.
                document["ended_elsewhere"] = {"state": run.state, "reason": run.reason}
                state, document["state"] = run.state, run.state
            run.state = state
            run.phase = "finished"
            run.verdict = document["verdict"]
            run.reason = " ".join(r["message"] for r in document["reasons"]) or None
            run.document = document
            run.report_path = report
            run.finished_at = finished
            for r in self.results:
                if r.kind != "load":
                    continue  # correctness probes are on the document, not request columns
                for role in ROLES:
                    cols = r.columns[role]
                    s.add(
                        SampleSet(
                            gate_id=self.gate_id,
                            scenario=r.name,
                            role=role,
                            requests=len(cols),
                            columns=cols.to_bytes(),
                        )
                    )
            if verdict is not None:
                for c in verdict.checks:
                    lo, hi = c.interval if c.interval else (None, None)
                    s.add(
                        CheckResult(
                            gate_id=self.gate_id,
                            check_id=c.id,
                            group=c.group,
                            scenario=c.scenario,
                            metric=c.metric,
                            quantile=c.quantile,
                            reference=_finite(c.reference),
                            candidate=_finite(c.candidate),
                            ratio=_finite(c.ratio),
                            interval_lo=_finite(lo),
                            interval_hi=_finite(hi),
                            threshold=_finite(c.threshold),
                            decision=c.decision,
                            samples_reference=c.samples[0],
                            samples_candidate=c.samples[1],
                            alpha=c.alpha,
                            message=c.message,
                        )
                    )


def _planned_words(planned_s: float | None, limits: Limits) -> str:
    """How a scenario's deadline was reckoned, for its message."""
    base = (
        f"{planned_s:.3g} s planned"
        if planned_s is not None
        else f"no planned duration, so the cap of {limits.max_scenario_duration_s:g} s"
    )
    return f"{base} x {limits.scenario_deadline_factor:g} + {limits.scenario_deadline_slack_s:g} s"


async def _in_daemon_thread(fn: Callable[[], _T], name: str) -> _T:
    """`fn()` on a thread of its own, awaited without blocking the event loop.

    Not `asyncio.to_thread`: a cancelled await leaves a to_thread call running in the loop's
    default executor, which `asyncio.run` joins at its end, so a gate cancelled while judging
    would still hold its process until the judge finished. A daemon thread is abandoned
    instead: the cancel ends the gate at once (teardown, release), and its result, if it ever
    comes, is dropped."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, exc: BaseException | None) -> None:
        if done.done():
            return  # cancelled meanwhile
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, exc = fn(), None
        except BaseException as e:  # handed to the awaiting task
            result, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    return await done


def _ready_s(eng: Engine) -> float | None:
    """Launch to ready for an engine the gate launched; None for attached or never-ready ones."""
    reached = eng.phases.reached
    if not eng.launched or "ready" not in reached or "launched" not in reached:
        return None
    return reached["ready"] - reached["launched"]


def _probe(result: suite_catalogue.ProbeResult) -> ProbeResult:
    return ProbeResult(
        ok=result.ok,
        status=result.status or 0,
        well_formed=result.well_formed,
        problems=tuple(result.problems),
    )


def _phase_durations(reached: Mapping[str, float]) -> dict[str, float]:
    """Time spent reaching each startup phase, from launch to ready (not teardown phases)."""
    order = sorted(
        ((name, at) for name, at in reached.items() if name not in ("stopped", "crashed")),
        key=lambda kv: kv[1],
    )
    out: dict[str, float] = {}
    for (_, prev), (name, at) in itertools.pairwise(order):
        out[name] = max(0.0, at - prev)
        if name == "ready":
            break
    return out


def _finite(x: float | None) -> float | None:
    if x is None or not np.isfinite(x):
        return None
    return float(x)


def _crash_detail(crash: CrashInfo) -> str:
    tail = " | ".join(line for line in crash.log_tail[-3:] if line.strip())
    out = f"{crash.description} at {crash.at_s:.1f}s into the gate"
    return f"{out}; last log lines: {tail}" if tail else out


async def run_gate(
    spec: GateSpec,
    settings: Settings,
    *,
    report_dir: Path | None = None,
    db_url: str | None = None,
    progress: Progress | None = None,
    gate_id: str = "",
    worker: str | None = None,
) -> GateOutcome:
    runner = GateRunner(
        spec, settings, report_dir, db_url, progress or NullProgress(), gate_id, worker
    )
    return await runner.run()
