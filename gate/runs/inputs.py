"""The judge's inputs, built one way for the live run and for re-judge: each load scenario's
per-request columns (cut to the prefix its last look saw, after the warm-up), its load phases,
the engines' facts and the compatibility probes.

The live run hands its evidence on as it is: the engines' phases, ready times, crashes and
capabilities (`EngineEvidence`, from the engines themselves, not through document types).
Re-judge reads the same evidence back from the stored verdict document and columns only
(`EngineEvidence.stored`, `RanScenario.stored`, `probe_pairs`), so it sees what the live judge
saw."""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gate.analysis.capacity import CapacitySearch
from gate.analysis.compat import ProbePair, ProbeResult
from gate.analysis.divergence import DivergenceSamples
from gate.analysis.engine_metrics import EngineSeries, ScenarioTelemetry
from gate.analysis.gpu import GpuScenario
from gate.analysis.judge import judge
from gate.analysis.load import OverloadPhase, PeakPhase
from gate.analysis.outputs import MirroredOutputs
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy
from gate.analysis.samples import Columns, select_requests
from gate.analysis.types import EngineFacts, ScenarioSamples, Verdict
from gate.core.vocabulary import ROLES, Role
from gate.engines.lifecycle import GATE_PHASES
from gate.runs.gpu_telemetry import gpu_scenario
from gate.runs.load_phases import load_phases
from gate.runs.mirrored_outputs import outputs_from_doc
from gate.spec import ScenarioSpec
from gate.verdict.document import (
    CapacityDoc,
    EngineDoc,
    EngineTelemetryDoc,
    ProbeDoc,
    ScenarioDoc,
    TelemetryDoc,
)


@dataclass(frozen=True)
class RanScenario:
    """One load scenario as it ran: columns by role, the schedule prefix judged (None: all),
    and its phase marks (name, start second)."""

    name: str
    columns: Mapping[str, Columns]
    upto: int | None = None
    marks: Sequence[tuple[str, float]] = ()
    outputs: MirroredOutputs | None = None
    telemetry: TelemetryDoc | None = None

    @classmethod
    def stored(cls, columns: Mapping[str, Columns], doc: ScenarioDoc | None) -> RanScenario:
        """From stored columns and the scenario's entry in the document."""
        upto = doc.early_stop.upto if doc is not None and doc.early_stop is not None else None
        marks = [(p.name, p.start_s) for p in doc.phases] if doc is not None else []
        name = doc.name if doc is not None else ""
        outputs = (
            outputs_from_doc(name, doc.outputs)
            if doc is not None and doc.outputs is not None
            else None
        )
        telemetry = doc.telemetry if doc is not None else None
        return cls(name, columns, upto, marks, outputs, telemetry)


def engine_series(doc: EngineTelemetryDoc | None) -> EngineSeries | None:
    """A stored timeline as the judge reads it (null values become NaN: gaps)."""
    if doc is None:
        return None
    series = {
        k: np.array([math.nan if x is None else x for x in v], dtype=np.float64)
        for k, v in doc.series.items()
        if len(v) == len(doc.t_s)
    }
    return EngineSeries(np.array(doc.t_s, dtype=np.float64), series, dict(doc.config))


def scenario_telemetry(name: str, doc: TelemetryDoc | None) -> ScenarioTelemetry | None:
    if doc is None:
        return None
    return ScenarioTelemetry(name, engine_series(doc.reference), engine_series(doc.candidate))


class CrashSeen(Protocol):
    """A crash as the judge words it: the live engine's (CrashInfo) or the document's."""

    @property
    def at_s(self) -> float: ...
    @property
    def description(self) -> str: ...
    @property
    def log_tail(self) -> Sequence[str]: ...


class EngineSeen(Protocol):
    """What the judge compares of an engine: its phases, its ready time, a crash, and how busy
    other work kept the gate host's CPUs during its launch."""

    @property
    def phases(self) -> Mapping[str, float]: ...
    @property
    def ready_s(self) -> float | None: ...
    @property
    def crash(self) -> CrashSeen | None: ...
    @property
    def launch_host_busy(self) -> float | None: ...
    @property
    def launch_cpu_wait_s(self) -> float | None: ...


@dataclass(frozen=True)
class EngineEvidence:
    """One engine as the judge reads it: startup phases (seconds into the gate), launch to
    ready (None: attached, or never ready), a crash, and what it answered it supports at
    readiness (None: not learned)."""

    phases: Mapping[str, float]
    ready_s: float | None
    crash: CrashSeen | None = None
    capabilities: Mapping[str, Any] | None = None
    launch_host_busy: float | None = None
    launch_cpu_wait_s: float | None = None

    @classmethod
    def stored(cls, doc: EngineDoc) -> EngineEvidence:
        """The engine as the stored verdict document describes it."""
        caps = doc.capabilities.model_dump() if doc.capabilities is not None else None
        return cls(
            doc.phases, doc.ready_s, doc.crash, caps, doc.launch_host_busy, doc.launch_cpu_wait_s
        )


def stored_engines(engines: Mapping[Role, EngineDoc] | None) -> dict[Role, EngineEvidence]:
    return {role: EngineEvidence.stored(doc) for role, doc in (engines or {}).items()}


@dataclass(frozen=True)
class JudgeInputs:
    scenarios: list[ScenarioSamples]
    peaks: list[PeakPhase]
    overloads: list[OverloadPhase]
    facts: list[EngineFacts]
    probes: list[ProbePair]
    outputs: list[MirroredOutputs]
    capabilities: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None)
    steady: tuple[str, ...] = ()  # open-loop scenarios of one rate: checked for saturation
    telemetry: list[ScenarioTelemetry] | None = None  # None: no scenario was sampled
    capacity: tuple[CapacitySearch, ...] = ()  # the capacity scenarios' searches
    gpu: tuple[GpuScenario, ...] = ()  # the engines' GPUs per sampled load scenario


def phase_durations(
    reached: Mapping[str, float], shared: Collection[str] | None = None
) -> dict[str, float]:
    """Time spent reaching each startup phase, from launch to ready (not teardown phases).

    `shared`: the phases both engines reached. A phase's duration is the gap from the phase
    before it among those, so a step only one engine logs (vLLM's `warmed_up` with CUDA graphs
    against an eager build, or a log line another engine family never writes: logphases.py)
    does not shorten the next shared phase of that engine alone and fail it against the other.
    Phases outside `shared` keep their gap in the engine's own order, for the note that they
    were reported by one engine only."""
    live = {n: at for n, at in reached.items() if n not in ("stopped", "crashed")}

    def gaps(names: Collection[str]) -> dict[str, float]:
        order = sorted(((n, live[n]) for n in names), key=lambda kv: kv[1])
        out: dict[str, float] = {}
        for (_, prev), (name, at) in itertools.pairwise(order):
            out[name] = max(0.0, at - prev)
            if name == "ready":
                break
        return out

    if shared is None:
        return gaps(live)
    common = [n for n in live if n in shared]
    own = {n: d for n, d in gaps(live).items() if n not in shared}
    return {**gaps(common), **own}


def crash_detail(crash: CrashSeen) -> str:
    tail = " | ".join(line for line in crash.log_tail[-3:] if line.strip())
    out = f"{crash.description} at {crash.at_s:.1f}s into the gate"
    return f"{out}; last log lines: {tail}" if tail else out


def paired_waits(engines: Mapping[Role, EngineSeen] | None) -> dict[Role, float]:
    """How long each engine, up and listing its model, waited for the other one: the gate
    warms both up together (gate/runs/engine_pair.py `warm_up`) and marks `warmup_done` and
    `ready` on both at its end, so the engine that came up first waited for the other, and
    that wait is not its own startup. Zero for the later one; empty when either was not seen
    up to its warm-up."""
    before: dict[Role, float] = {}
    for role in ROLES:
        eng = (engines or {}).get(role)
        if eng is None or "warmup_done" not in eng.phases:
            return {}
        # the gate's last check before the warm-up, not a line the engine logged during it;
        # without it (an engine described otherwise), its last own phase before the warm-up
        at = eng.phases.get("model_listed")
        if at is None:
            done = eng.phases["warmup_done"]
            own = [t for n, t in eng.phases.items() if n not in GATE_PHASES and t <= done]
            if not own:
                return {}
            at = max(own)
        before[role] = at
    both = max(before.values())
    return {role: max(0.0, both - at) for role, at in before.items()}


def engine_facts(engines: Mapping[Role, EngineSeen] | None) -> list[EngineFacts]:
    """What the judge compares of the engines: ready time, startup phases, crashes. An
    engine's wait for the other before their paired warm-up (`paired_waits`) is taken out of
    its ready time and of its `warmup_done` phase: an engine that came up faster was held
    for it (startup.phase.warmup_done, 6.4 s against 1.2 s, in an A/A gate of real vLLM)."""
    facts = []
    docs = [d for d in (engines or {}).values() if d is not None]
    shared = set.intersection(*(set(d.phases) for d in docs)) if len(docs) == 2 else None
    waits = paired_waits(engines)
    for role in ROLES:
        eng = (engines or {}).get(role)
        ready = eng.ready_s if eng is not None else None
        crash = eng.crash if eng is not None else None
        phases = (
            phase_durations(eng.phases, shared) if eng is not None and ready is not None else {}
        )
        wait = waits.get(role, 0.0)
        if ready is not None and wait > 0.0:
            ready = max(0.0, ready - wait)
            if "warmup_done" in phases:
                phases["warmup_done"] = max(0.0, phases["warmup_done"] - wait)
        facts.append(
            EngineFacts(
                role=role,
                ready_s=ready,
                crashed=crash is not None,
                crash_detail=crash_detail(crash) if crash is not None else None,
                phases=phases,
                launch_host_busy=eng.launch_host_busy if eng is not None else None,
                launch_cpu_wait_s=eng.launch_cpu_wait_s if eng is not None else None,
            )
        )
    return facts


def probe_pairs(probes: Sequence[ProbeDoc] | None) -> list[ProbePair]:
    def side(doc: ProbeDoc, role: Role) -> ProbeResult:
        r = doc.reference if role == "reference" else doc.candidate
        return ProbeResult(
            ok=r.ok,
            status=r.status or 0,
            well_formed=not r.problems,
            problems=tuple(r.problems),
        )

    return [ProbePair(p.name, side(p, "reference"), side(p, "candidate")) for p in probes or []]


def judge_inputs(
    scenarios: Mapping[str, ScenarioSpec],
    ran: Iterable[RanScenario],
    engines: Mapping[Role, EngineEvidence],
    probes: Sequence[ProbeDoc] | None,
    warmup: int,
    capacity: Sequence[CapacityDoc] | None = None,
) -> JudgeInputs:
    """Everything but divergence (its raw probes live only in the run that made them);
    `capacity`: the capacity scenarios' searches as their documents hold them (live and
    re-judge alike)."""
    samples: list[ScenarioSamples] = []
    peaks: list[PeakPhase] = []
    overloads: list[OverloadPhase] = []
    steady: list[str] = []
    ran_list = list(ran)
    for r in ran_list:
        sc = scenarios.get(r.name)
        if sc is None or set(r.columns) != set(ROLES):
            continue
        ref = select_requests(r.columns["reference"], warmup, r.upto)
        cand = select_requests(r.columns["candidate"], warmup, r.upto)
        samples.append(ScenarioSamples(r.name, ref.to_arm(), cand.to_arm()))
        if sc.suite in (None, "normal") and sc.arrival != "concurrency":
            steady.append(r.name)
        p, o = load_phases(r.name, sc.suite, sc.settings, ref, cand, list(r.marks))
        peaks.extend(p)
        overloads.extend(o)
    outputs = [r.outputs for r in ran_list if r.outputs is not None and r.name in scenarios]
    sampled = [
        t
        for r in ran_list
        if r.name in scenarios and (t := scenario_telemetry(r.name, r.telemetry)) is not None
    ]
    gpu = tuple(
        g
        for r in ran_list
        if r.name in scenarios and (g := gpu_scenario(r.name, r.telemetry, r.columns)) is not None
    )
    return JudgeInputs(
        samples,
        peaks,
        overloads,
        engine_facts(engines),
        probe_pairs(probes),
        outputs,
        engine_capabilities(engines),
        tuple(steady),
        sampled or None,
        tuple(c.search() for c in capacity or [] if c.name in scenarios),
        gpu,
    )


def engine_capabilities(
    engines: Mapping[Role, EngineEvidence],
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """(reference, candidate) capabilities (None: not learned)."""

    def of(role: Role) -> Mapping[str, Any] | None:
        eng = engines.get(role)
        return eng.capabilities if eng is not None else None

    return of("reference"), of("candidate")


def judge_gate(
    inputs: JudgeInputs,
    policy: Policy,
    *,
    plan: Plan | None = None,
    divergence: DivergenceSamples | None = None,
    envelope_share: float | None = None,
) -> Verdict:
    return judge(
        inputs.scenarios,
        inputs.facts,
        policy,
        plan=plan,
        peaks=inputs.peaks,
        overloads=inputs.overloads,
        probes=inputs.probes,
        divergence=divergence,
        outputs=inputs.outputs,
        capabilities=inputs.capabilities,
        envelope_share=envelope_share,
        saturation=inputs.steady,
        telemetry=inputs.telemetry,
        capacities=inputs.capacity,
        gpu=inputs.gpu,
    )
