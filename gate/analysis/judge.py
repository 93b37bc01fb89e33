"""The judge: samples and engine facts in, continue or hold with the evidence out.

Error control (statistics.md, "Many checks at once"): weighted Bonferroni over budget groups
(policy.alpha_split), split evenly inside a group, with anytime-valid tests for everything the
gate may look at repeatedly (latency, errors, load) and fixed-sample tests for what is evaluated
once (divergence, repeated launches), so the probability of holding a candidate that meets every
tolerance is at most alpha whatever the dependence between checks and however often the gate
looked:

    latency      paired quantile checks, scenario x metric x quantile (latency.py, paired.py)
    tail         paired tail checks, the slowest 5% as a whole, scenario x metric (latency.py)
    errors       one count test per scenario, pooled and per kind (errors.py)
    correctness  five envelope tests of numerical divergence (divergence.py)
    load         goodput per peak phase, collapse per overload phase (load.py)
    capacity     the candidate's sustainable rate against the reference's, by the interval
                 of a paired rate search (capacity.py: a rule on that interval, no alpha)
    startup      startup phases tested across repeated launches (engines.py)

Facts hold without spending alpha: crashes, restarts and OOM of either engine, NaN logprobs and
empty outputs, runaway generations, greedy flips outside the reference's top-k, broken API
probes; and
single observations are compared by rules with a tolerance and a slack: startup phases of one
launch, recovery time after one overload.

The judge is asked once per gate, at the end. Given the `Plan` the gate followed while it looked
at growing prefixes (sequential.py), it uses the plan's fixed tunings and alphas, so its verdict
agrees with what the gate saw at its last look; without a plan it tunes every check to the
samples it holds (valid for that one look).
Continue only when no check holds (`Check.holds`) and latency was actually compared. A failed
check is evidence of a regression and always holds. An undecided check is a lack of evidence:
it holds for every fact-based and error check (an engine that served nothing cannot be judged),
but a latency or tail check left undecided holds only when the policy `require`s it; otherwise
it stays in the verdict with the smallest regression the gate could have detected, and the gate
decides on evidence. A check the policy lists in `advisory` is judged the same and never holds
(advisory.py): the verdict lists it apart when it would have.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gate.analysis.advisory import mark_advisory
from gate.analysis.capacity import CapacitySearch, capacity_checks
from gate.analysis.checks import rule_check
from gate.analysis.compat import ProbePair, capability_checks, compatibility_checks
from gate.analysis.divergence import DivergenceSamples, divergence_checks, envelope_early_share
from gate.analysis.engine_metrics import ScenarioTelemetry, engine_metric_checks
from gate.analysis.engines import crash_checks, startup_checks
from gate.analysis.errors import ENVIRONMENT, error_checks, outputs_checks
from gate.analysis.gpu import GpuScenario, gpu_checks
from gate.analysis.latency import latency_checks, planned_latency_checks
from gate.analysis.load import OverloadPhase, PeakPhase, load_checks
from gate.analysis.outputs import MirroredOutputs, mirrored_output_checks
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy
from gate.analysis.saturation import saturation_checks
from gate.analysis.types import Check, EngineFacts, ScenarioSamples, Verdict

__all__ = ["judge"]

_REASON_ORDER = {
    "crash": 0,
    "correctness": 1,
    "compatibility": 2,
    "startup": 3,
    "errors": 4,
    "latency": 5,
    "peak": 6,
    "overload": 7,
    "recovery": 8,
    "engine": 9,
    "capacity": 10,
    "gpu": 11,
}


def _coverage_check() -> Check:
    return rule_check(
        "latency.coverage",
        "latency",
        "latency",
        "undecided",
        "No latency check could be compared in any scenario (each needs 4 blocks of paired "
        "requests), so there is no evidence that the candidate is as fast as the reference.",
    )


def _one_environment(checks: list[Check]) -> list[Check]:
    """The test bed is one: several `gate.environment` checks (errors, saturation, scenarios)
    become one, their messages joined."""
    env = [c for c in checks if c.id == ENVIRONMENT]
    if len(env) < 2:
        return checks
    # The merged check holds when any of them does (a warning never weakens a hold).
    first = next((c for c in env if c.required), env[0])
    warnings = [c.warning for c in env if c.warning]
    merged = replace(
        first,
        scenario=None,
        message=" ".join(c.message for c in env),
        warning=None if first.required else " ".join(warnings) or None,
    )
    out = [c for c in checks if c.id != ENVIRONMENT]
    out.append(merged)
    return out


def _extension_notes(scenarios: Sequence[ScenarioSamples], plan: Plan, policy: Policy) -> list[str]:
    """A scenario that ran past its planned size says so (a check was undecided there)."""
    out = []
    for s in scenarios:
        planned = plan.requests.get(s.name)
        n = min(s.reference.requests, s.candidate.requests)
        if planned is not None and n > planned:
            out.append(
                f"{s.name} runs past its planned {planned} requests per arm, to {n} (limit "
                f"{plan.limit(s.name)}, policy extend {policy.extend:g}): a check was still "
                "undecided at the planned size."
            )
    return out


def judge(
    scenarios: Sequence[ScenarioSamples],
    engines: Sequence[EngineFacts],
    policy: Policy,
    *,
    plan: Plan | None = None,
    peaks: Sequence[PeakPhase] = (),
    overloads: Sequence[OverloadPhase] = (),
    probes: Sequence[ProbePair] = (),
    divergence: DivergenceSamples | None = None,
    outputs: Sequence[MirroredOutputs] = (),
    capabilities: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] = (None, None),
    envelope_share: float | None = None,
    saturation: Collection[str] = (),
    telemetry: Sequence[ScenarioTelemetry] | None = None,
    capacities: Sequence[CapacitySearch] = (),
    gpu: Sequence[GpuScenario] = (),
) -> Verdict:
    """Every check of the gate and the verdict they support (module docstring).

    plan: the plan the gate looked by (must carry this policy); peaks, overloads: load phases
    (load.py); probes: API probes (compat.py); divergence: numerical divergence samples
    (divergence.py); outputs: the load scenarios' mirrored outputs compared (outputs.py);
    capabilities: what each engine supports, (reference, candidate) (compat.py);
    envelope_share: the reference's early share against itself when `divergence` is not
    given (re-judge reads it from the document); saturation: the steady open-loop scenarios,
    whose engines are checked for a queue that grows through them (saturation.py: the
    candidate's alone holds, the reference's is the test bed's); telemetry: both engines'
    own metrics per load scenario (engine_metrics.py; None: not sampled, no engine checks);
    capacities: the capacity scenarios' searches (capacity.py); gpu: the engines' GPUs per
    load scenario, from the same timelines (gpu.py).
    """
    if plan is not None and plan.policy != policy:
        raise ValueError("the plan was built for another policy")
    notes: list[str] = []
    checks: list[Check] = []
    if plan is None:
        checks.extend(latency_checks(scenarios, policy, notes))
        checks.extend(error_checks(scenarios, policy, notes))
    else:
        notes.extend([*plan.notes, *_extension_notes(scenarios, plan, policy)])
        checks.extend(planned_latency_checks(scenarios, plan, notes))
        checks.extend(
            error_checks(scenarios, policy, notes, alpha=plan.error_alpha, planned=None, plan=plan)
        )
    if not any(c.group == "latency" for c in checks):
        checks.insert(0, _coverage_check())
    for s in scenarios:
        if s.name in saturation:
            checks.extend(saturation_checks(s, notes))
    checks = _one_environment(checks)
    checks.extend(outputs_checks(scenarios))
    checks.extend(startup_checks(engines, policy, notes))
    checks.extend(crash_checks(engines))
    checks.extend(load_checks(peaks, overloads, policy, notes))
    checks.extend(capacity_checks(capacities, policy))
    checks.extend(compatibility_checks(probes, notes))
    checks.extend(capability_checks(*capabilities, notes))
    if divergence is not None:
        checks.extend(divergence_checks(divergence, policy, notes))
    # The reference's early share: from the correctness samples, or as re-judge's document kept it
    share = envelope_early_share(divergence, policy) if divergence is not None else envelope_share
    checks.extend(mirrored_output_checks(outputs, policy, share))
    if telemetry is not None:
        checks.extend(engine_metric_checks(telemetry, policy, notes))
    checks.extend(gpu_checks(gpu, policy, notes))
    checks = mark_advisory(checks, policy)
    reasons = sorted(
        (c for c in checks if c.holds),
        key=lambda c: (c.decision != "fail", _REASON_ORDER[c.group]),
    )
    return Verdict(
        decision="hold" if reasons else "continue",
        checks=tuple(checks),
        reasons=tuple(reasons),
        notes=tuple(notes),
    )
