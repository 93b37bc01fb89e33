"""The gate's two engines: built from the spec by their kind, started together, warmed up,
watched for crashes while load runs, torn down whatever happened, and described for the
verdict document.

Two engines that share the gate host's CPUs (both processes here, and no GPU on the host:
`share_host_cpus`) are started one after the other, the reference first: started together they
compete for the CPUs through every startup step (a CPU vLLM compiles and profiles for tens of
seconds), and a step one engine ran while the other held the cores differs by seconds between
identical servers (an A/A held on `startup.phase.engine_initialized`, 3.5 s against 0.4 s, on
two cores). In turn, each engine's phases are its own; the first one's wait for the second is
taken out by `gate/runs/inputs.py` like any wait for the paired warm-up.

Starting in turn keeps the two engines from slowing each other, not other work on the host
from slowing either (a CI runner's other jobs). Over each process engine's launch (its
start), the gate reads how busy work other than its engines kept the host's CPUs and the
longest any thread of the engine waited for one (gate/telemetry/host_cpu.py); the startup
rules read both (gate/analysis/engines.py) and say "not shown" where that wait, not the
engine, could explain a failure.

An engine's kind (gate/spec/kinds.py, `ENGINE_KINDS`) says how it runs, its runtime; a launcher
here is a function from the spec's engine to an `Engine` (gate/engines) for each runtime:
`process` (a local command, a preset, worker groups), `endpoint` (an attached URL), `kubernetes`
(a Pod or LeaderWorkerSet). A new kind that runs as one of these is one entry in ENGINE_KINDS;
a new runtime is a launcher here and the `describe` of its engine class.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gate.core.errors import EngineError, GateError
from gate.core.limits import scenario_deadline_s
from gate.core.vocabulary import ROLES, Role
from gate.engines.describe import placement_doc, ready_s, unlaunched_doc
from gate.engines.groups import ROUTER, GroupedEngine, WorkerSpec
from gate.engines.launchers import TERM_GRACE_S, EndpointEngine, Engine, ProcessEngine
from gate.engines.lifecycle import CrashInfo
from gate.reservations.allocator import Placement
from gate.reservations.service import teardown_margin_s
from gate.runs.context import RunContext
from gate.runs.gpu_telemetry import engine_gpus
from gate.runs.inputs import EngineEvidence
from gate.runs.schedules import LazyRequests
from gate.runs.testbed import describe_testbed, visible_gpus
from gate.spec import EngineSpec, Runtime
from gate.telemetry.gpu_sources import Chosen, choose_sources
from gate.telemetry.host_cpu import (
    CpuReading,
    HostCpu,
    TreeUse,
    longest_wait_s,
    others_busy_share,
    thread_waits,
    tree_uses,
)
from gate.verdict.document import CapabilitiesDoc, EngineDoc, PlatformDoc
from loadgen.capabilities import Capabilities, ask_version, discover
from loadgen.client import Target
from loadgen.runner import run_paired

ENGINE_WARMUP_REQUESTS = 4
CAPABILITY_BUDGET_S = 60.0
"""The most the capability asks may take per engine: eight tiny requests (~1 s on a GPU)."""
CRASH_POLL_S = 0.1
CONTENTION_NOTE_SHARE = 0.2
"""A load scenario in which the load generator's or a local engine's longest-waiting thread
waited for a CPU this share of the time or more gets a note (`Engines.contention_note`): 2.5%
for the load generator on a quiet two-core host here, 71% with four busy processes beside a
gate at nice 10, where TTFT 20 ms against 30 ms read 1.30x instead of 1.50x."""

Launcher = Callable[["Engines", Role, EngineSpec, Placement | None], Engine]


@runtime_checkable
class LocalEngine(Protocol):
    """An engine of processes on this host (ProcessEngine, GroupedEngine): its root pids, and
    the CPU time of attempts it killed (a port retry)."""

    retired_cpu_s: float

    def own_pids(self) -> list[int]: ...


@dataclass(frozen=True)
class CpuMark:
    """The CPU counters at one instant: the host's, each local engine's trees (by role), and
    all of the engines' own CPU seconds so far."""

    reading: CpuReading
    uses: dict[str, TreeUse]
    own_s: float
    gate: TreeUse = field(default_factory=TreeUse)  # this process's own threads' waits

    def since(self, before: CpuMark) -> CpuSpan:
        """What happened between `before` and this mark (CpuSpan)."""
        waits = {
            role: longest_wait_s(before.uses.get(role, TreeUse()), use) if use.waits else None
            for role, use in self.uses.items()
        }
        busy = others_busy_share(before.reading, self.reading, self.own_s - before.own_s)
        return CpuSpan(busy, waits, longest_wait_s(before.gate, self.gate))


@dataclass(frozen=True)
class CpuSpan:
    """Between two marks: how busy other work than the engines kept the host's CPUs (None:
    not read), the longest any thread of each local engine waited for one (by role; None: no
    schedstats), and the longest any thread of this process (the load generator) waited."""

    others_busy: float | None
    engine_waits: dict[str, float | None]
    gate_wait: float


def _endpoint(engines: Engines, role: Role, es: EngineSpec, placement: Placement | None) -> Engine:
    assert es.url is not None
    ctx = engines.ctx
    return EndpointEngine(
        role=role,
        base_url=es.url,
        model=ctx.spec.model,
        phases=ctx.phase_log(role),
        readiness_timeout_s=es.readiness_timeout_s,
        allow=list(ctx.settings.engine_url_allow) if es.caller_url else None,
    )


def _process(engines: Engines, role: Role, es: EngineSpec, placement: Placement | None) -> Engine:
    ctx = engines.ctx
    log_dir = ctx.settings.data_dir / "logs" / ctx.gate_id
    if es.groups is not None:
        return _grouped(engines, role, es, placement)
    return ProcessEngine(
        role=role,
        argv_template=es.argv_template(),
        model=ctx.spec.model,
        phases=ctx.phase_log(role),
        log_path=log_dir / f"{role}.log",
        placement=placement.for_role(role) if placement else None,
        env=dict(es.env),
        cwd=es.cwd,
        readiness_timeout_s=es.readiness_timeout_s,
        gate_id=ctx.gate_id,
        term_grace_s=engine_grace_s(ctx.settings.lease_ttl_s),
    )


def _grouped(engines: Engines, role: Role, es: EngineSpec, placement: Placement | None) -> Engine:
    """Worker groups behind a router (gate/engines/groups.py), each group on its own GPUs."""
    assert es.groups is not None and es.router is not None
    ctx = engines.ctx

    def worker(name: str, member: EngineSpec) -> WorkerSpec:
        return WorkerSpec(name, member.argv_template(name), dict(member.env), member.cwd)

    return GroupedEngine(
        role=role,
        workers=[worker(n, g) for n, g in es.groups.items()],
        router=worker(ROUTER, es.router),
        model=ctx.spec.model,
        phases=ctx.phase_log(role),
        log_dir=ctx.settings.data_dir / "logs" / ctx.gate_id,
        placement=placement.for_role(role) if placement else None,
        readiness_timeout_s=es.readiness_timeout_s,
        gate_id=ctx.gate_id,
        term_grace_s=engine_grace_s(ctx.settings.lease_ttl_s),
    )


def engine_grace_s(lease_ttl_s: float) -> float:
    """SIGTERM to SIGKILL for an engine at teardown: TERM_GRACE_S, shorter when the lease is
    so short that its teardown margin could not hold it (a stop waits at most twice this)."""
    return min(TERM_GRACE_S, teardown_margin_s(lease_ttl_s) / 3)


def _kubernetes(
    engines: Engines, role: Role, es: EngineSpec, placement: Placement | None
) -> Engine:
    # Imported here: the kubernetes client takes a second to import, which other gates skip.
    from gate.runs.kubernetes_kind import kubernetes_engine

    if placement is None:  # the reservation stage reserves for every kubernetes engine
        raise EngineError(role, "launched", "a kubernetes engine needs reserved GPUs")
    return kubernetes_engine(engines.ctx, role, es, placement, list(engines.built.values()))


LAUNCHERS: dict[Runtime, Launcher] = {
    "endpoint": _endpoint,
    "process": _process,
    "kubernetes": _kubernetes,
}


@dataclass
class Engines:
    """Both engines of one gate, and the crashes seen so far (the first of each role)."""

    ctx: RunContext
    placement: Placement | None
    built: dict[Role, Engine] = field(default_factory=dict)
    crashes: list[CrashInfo] = field(default_factory=list)
    capabilities: dict[Role, Capabilities] = field(default_factory=dict)
    versions: dict[Role, tuple[str | None, str | None]] = field(default_factory=dict)
    telemetry: Chosen | None = None  # the GPU sources, chosen at the first load scenario
    launch_busy: dict[Role, float | None] = field(default_factory=dict)  # others' CPU share
    launch_wait: dict[Role, float | None] = field(default_factory=dict)  # longest CPU wait, s
    _shares_host: bool | None = None  # share_host_cpus, once asked
    _host_cpu: HostCpu | None = None

    def gpu_sources(self) -> Chosen:
        """Each engine's GPU source (gate/telemetry/gpu_sources.py), chosen once per gate."""
        if self.telemetry is None:
            s = self.ctx.settings
            gpus = engine_gpus(self.ctx.spec, self.placement)
            self.telemetry = choose_sources(gpus, s.gpu_telemetry, s.dcgm_url)
        return self.telemetry

    def share_host_cpus(self) -> bool:
        """Both engines are processes on this host and it has no GPU: its CPUs are their
        compute, and the load generator's (a reservation from the local inventory names GPUs
        they cannot use here). Asked once per gate."""
        if self._shares_host is None:
            local = all(self.ctx.spec.engine(r).runtime == "process" for r in ROLES)
            self._shares_host = local and not visible_gpus()[0]
        return self._shares_host

    async def launch(self) -> None:
        """Build both, then start both at once, or one after the other when they share this
        host's CPUs (module docstring); the first failure in role order is raised."""
        for role in ROLES:
            es = self.ctx.spec.engine(role)
            self.built[role] = LAUNCHERS[es.runtime](self, role, es, self.placement)
        if await asyncio.to_thread(self.share_host_cpus):
            self.ctx.gate_phase(
                "launching", "one engine after the other: both share this host's CPUs"
            )
            for role in ROLES:
                await self._start(role)
            return
        tasks = [asyncio.create_task(self._start(r)) for r in ROLES]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:  # the first failure in role order names the engine that blocked
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    async def _start(self, role: Role) -> None:
        """Start one engine; for a process on this host, measure its launch (to the end of
        its start): how busy other work kept the host's CPUs, and the longest any of its
        threads waited for one (gate/telemetry/host_cpu.py). Rounded here, as the document
        stores them, so that a verdict judged again from the document is the same."""
        if self.ctx.spec.engine(role).runtime != "process":
            await self.built[role].start()
            return
        before = await asyncio.to_thread(self.cpu_mark, False)
        await self.built[role].start()
        span = (await asyncio.to_thread(self.cpu_mark, True)).since(before)
        busy, wait = span.others_busy, span.engine_waits.get(role)
        self.launch_busy[role] = round(busy, 3) if busy is not None else None
        self.launch_wait[role] = round(wait, 3) if wait is not None else None

    def cpu_mark(self, host_first: bool) -> CpuMark:
        """The host's CPU counters and the engines' process trees (their keepers' own threads
        left out of the waits), from one scan of /proc; the host is read on the side of the
        scan away from the window it bounds, so the scan's own CPU is not counted as other
        work."""
        if self._host_cpu is None:
            self._host_cpu = HostCpu()
        local = {r: e for r, e in self.built.items() if isinstance(e, LocalEngine)}
        roots = {str(r): e.own_pids() for r, e in local.items()}
        retired = sum(e.retired_cpu_s for e in local.values())
        if host_first:
            reading = self._host_cpu.read()
            uses = tree_uses(roots, root_waits=False)
        else:
            uses = tree_uses(roots, root_waits=False)
            reading = self._host_cpu.read()
        own = retired + sum(u.cpu_s for u in uses.values())
        return CpuMark(reading, uses, own, TreeUse(waits=thread_waits(os.getpid())))

    def contention_note(
        self, scenario: str, before: CpuMark, after: CpuMark, seconds: float
    ) -> str | None:
        """A note when this process's threads (the load generator's) or a local engine's
        waited for a CPU for a good part of a load scenario (CONTENTION_NOTE_SHARE of its
        time or more, the longest-waiting thread's): the latencies then include this host's
        contention, which adds to both engines' and makes a relative regression read smaller
        than it is. Says, decides nothing."""
        if seconds <= 0.0:
            return None
        span = after.since(before)
        shares = {"the load generator": span.gate_wait / seconds}
        for role, wait in sorted(span.engine_waits.items()):
            if wait is not None:
                shares[f"the {role}"] = wait / seconds
        if max(shares.values()) < CONTENTION_NOTE_SHARE:
            return None
        said = ", ".join(f"{who} {min(v, 1.0):.0%}" for who, v in shares.items())
        busy = span.others_busy
        others = f"; other work kept {busy:.0%} of its CPUs busy" if busy is not None else ""
        return (
            f"In scenario {scenario}, threads waited for a CPU of this host for a good part of "
            f"its {seconds:.0f} s (the longest-waiting thread of {said}){others}. Latencies "
            "measured on a starved host include its delays, which add to both engines and make "
            'a relative regression read smaller than it is (docs/statistics.md, "Where the '
            'guarantee is weakest").'
        )

    def targets(self, api: str) -> list[Target]:
        return [
            Target(
                name=role,
                base_url=self.built[role].base_url,
                api=api,  # type: ignore[arg-type]
                model=self.ctx.spec.model,
            )
            for role in ROLES
        ]

    async def warm_up(self) -> None:
        """A few requests per engine before any measurement: first-request costs (lazy
        compilation, CUDA graph capture, connection set-up) are not what we compare."""
        spec = self.ctx.spec
        first = spec.scenarios[0]
        reqs = LazyRequests(first, seed=spec.seed + 7_919, length=ENGINE_WARMUP_REQUESTS)
        result = await run_paired(self.targets(first.api), reqs, concurrency=2)
        failed = [(role, r) for role, recs in result.records.items() for r in recs if r.error_kind]
        self.check_crashes()
        if self.crashes:
            raise GateError(f"{self.crashes[0].summary()} during warm-up")
        for role in ROLES:
            self.built[role].phases.mark("warmup_done")
            self.built[role].phases.mark("ready")
        if failed:
            who, rec = failed[0]
            self.ctx.gate_phase(
                "warmup_errors",
                f"{len(failed)} warm-up requests failed; first: "
                f"{who} {rec.error_kind}: {rec.error_message}",
            )

    async def discover(self) -> None:
        """What each engine supports (loadgen/capabilities.py), asked once both are ready;
        the stages adapt to it and the judge compares it (gate/analysis/compat.py)."""
        # A minute at most, less when the probe suites' cap is smaller (limits.py): an engine
        # that hangs has not answered, and the features it did not answer are lacking.
        budget = min(CAPABILITY_BUDGET_S, scenario_deadline_s(None, self.ctx.limits))
        targets = self.targets("completions")
        found, versions = await asyncio.gather(
            asyncio.gather(*(discover(t, budget_s=budget) for t in targets)),
            asyncio.gather(*(ask_version(t) for t in targets)),
        )
        self.capabilities = dict(zip(ROLES, found, strict=True))
        self.versions = dict(zip(ROLES, versions, strict=True))
        self.check_crashes()
        lacking = {
            role: [f for f in Capabilities.FEATURES if not caps.has(f)]
            for role, caps in self.capabilities.items()
        }
        said = "; ".join(
            f"{role} lacks {', '.join(fs)}" if fs else f"{role} has every feature asked for"
            for role, fs in lacking.items()
        )
        self.ctx.gate_phase("capabilities", said)

    def capabilities_doc(self, role: Role) -> CapabilitiesDoc | None:
        caps = self.capabilities.get(role)
        return CapabilitiesDoc.model_validate(caps.to_dict()) if caps is not None else None

    def check_crashes(self) -> None:
        seen = {c.role for c in self.crashes}
        for role in ROLES:
            eng = self.built.get(role)
            if eng is None or role in seen:
                continue
            crash = eng.crashed()
            if crash is not None:
                self.crashes.append(crash)
                self.ctx.phase(role, "crashed", crash.at_s, crash.description)

    async def watch(self, stop: asyncio.Event) -> None:
        """Poll for a crash until `stop`; a crash sets `stop` (the scenario ends, aborted)."""
        while not stop.is_set():
            before = len(self.crashes)
            self.check_crashes()
            if len(self.crashes) > before:
                stop.set()
                return
            await asyncio.sleep(CRASH_POLL_S)

    async def teardown(self) -> None:
        if self.telemetry is not None:
            self.telemetry.close()
        for role in ROLES:
            eng = self.built.get(role)
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

    def _crash(self, role: Role) -> CrashInfo | None:
        return next((c for c in self.crashes if c.role == role), None)

    def evidence(self) -> dict[Role, EngineEvidence]:
        """The engines as the judge reads them: exact phases and ready times (not rounded for
        people), crashes and capabilities, straight from the engines."""
        out = {}
        for role, eng in self.built.items():
            caps = self.capabilities.get(role)
            out[role] = EngineEvidence(
                phases=dict(eng.phases.reached),
                ready_s=ready_s(eng),
                crash=self._crash(role),
                capabilities=caps.to_dict() if caps is not None else None,
                launch_host_busy=self.launch_busy.get(role),
                launch_cpu_wait_s=self.launch_wait.get(role),
            )
        return out

    def testbed(self) -> PlatformDoc:
        """The hardware and software this gate ran on (runs/testbed.py)."""
        digests = {role: getattr(eng, "image_digest", None) for role, eng in self.built.items()}
        return describe_testbed(self.ctx.spec, self.versions, digests)

    def describe(self) -> dict[Role, EngineDoc]:
        """Both engines for the verdict document, built or not."""
        out: dict[Role, EngineDoc] = {}
        for role in ROLES:
            es = self.ctx.spec.engine(role)
            placement = None
            if self.placement is not None and es.engine_kind.launched:
                every_node = es.runtime == "kubernetes"
                placement = placement_doc(self.placement.for_role(role), every_node=every_node)
            crash = self._crash(role)
            eng = self.built.get(role)
            if eng is None:
                out[role] = unlaunched_doc(es.runtime, es.url, placement)
            else:
                out[role] = eng.describe(placement, crash).model_copy(
                    update={
                        "capabilities": self.capabilities_doc(role),
                        "launch_host_busy": self.launch_busy.get(role),
                        "launch_cpu_wait_s": self.launch_wait.get(role),
                    }
                )
        return out
