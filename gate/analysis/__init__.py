"""Statistical judge of the deploy gate: a pure core (numpy, scipy, pydantic; no I/O).

The gate collects samples and engine facts, and this package turns them into a verdict with the
evidence behind it. Modules: paired (paired, blocked, anytime-valid t tests of the two engines'
latencies), sequences (anytime-valid quantile confidence sequences), counts (sequential count
tests on errors, pooled and per kind), bounded (betting confidence sequences for paired
fractions), estimates (Harrell-Davis estimates, block-bootstrap intervals), policy (the user-
facing settings), types (inputs and outputs), checks (the shapes of a check), plan (checks
fixed before the data), latency (quantile and tail checks), errors, engines, load, compat and
divergence (the checks), sequential (looks at growing prefixes), judge (the verdict), baseline
(a Kayenta-style judge for comparison) and calibration (simulated gates: false-hold rate and
power of both).

The names below are imported on first use (PEP 562), so that importing one module of the package
(the spec reads `gate.analysis.policy`) does not load scipy.stats for every command: `gate
--version` and the CLI's start-up stay fast. The judge itself is `gate.analysis.judge.judge`
(a name of the package would be its submodule's once that is imported)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "ArmSamples": "gate.analysis.types",
    "Check": "gate.analysis.types",
    "DivergenceSamples": "gate.analysis.divergence",
    "EngineFacts": "gate.analysis.types",
    "GreedyPair": "gate.analysis.divergence",
    "GreedyRun": "gate.analysis.divergence",
    "Look": "gate.analysis.sequential",
    "OverloadPhase": "gate.analysis.load",
    "PeakPhase": "gate.analysis.load",
    "Plan": "gate.analysis.plan",
    "Policy": "gate.analysis.policy",
    "ProbePair": "gate.analysis.compat",
    "ProbeResult": "gate.analysis.compat",
    "RequestLog": "gate.analysis.load",
    "ScenarioSamples": "gate.analysis.types",
    "Scored": "gate.analysis.divergence",
    "SequentialJudge": "gate.analysis.sequential",
    "Slo": "gate.analysis.load",
    "TeacherForcedPair": "gate.analysis.divergence",
    "Verdict": "gate.analysis.types",
    "bootstrap_ratio_intervals": "gate.analysis.estimates",
    "count_bounds": "gate.analysis.sequences",
    "hd_quantile": "gate.analysis.estimates",
    "hd_quantiles": "gate.analysis.estimates",
    "kind_mixture_pvalues": "gate.analysis.counts",
    "min_samples_for_finite": "gate.analysis.sequences",
    "quantile_cs": "gate.analysis.sequences",
    "quantile_key": "gate.analysis.policy",
    "quantile_ratio": "gate.analysis.estimates",
    "sequential_count_pvalue": "gate.analysis.counts",
    "sequential_count_pvalues": "gate.analysis.counts",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'gate.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the names for type checkers, re-exported
    from gate.analysis.compat import ProbePair as ProbePair
    from gate.analysis.compat import ProbeResult as ProbeResult
    from gate.analysis.counts import kind_mixture_pvalues as kind_mixture_pvalues
    from gate.analysis.counts import sequential_count_pvalue as sequential_count_pvalue
    from gate.analysis.counts import sequential_count_pvalues as sequential_count_pvalues
    from gate.analysis.divergence import DivergenceSamples as DivergenceSamples
    from gate.analysis.divergence import GreedyPair as GreedyPair
    from gate.analysis.divergence import GreedyRun as GreedyRun
    from gate.analysis.divergence import Scored as Scored
    from gate.analysis.divergence import TeacherForcedPair as TeacherForcedPair
    from gate.analysis.estimates import bootstrap_ratio_intervals as bootstrap_ratio_intervals
    from gate.analysis.estimates import hd_quantile as hd_quantile
    from gate.analysis.estimates import hd_quantiles as hd_quantiles
    from gate.analysis.estimates import quantile_ratio as quantile_ratio
    from gate.analysis.load import OverloadPhase as OverloadPhase
    from gate.analysis.load import PeakPhase as PeakPhase
    from gate.analysis.load import RequestLog as RequestLog
    from gate.analysis.load import Slo as Slo
    from gate.analysis.plan import Plan as Plan
    from gate.analysis.policy import Policy as Policy
    from gate.analysis.policy import quantile_key as quantile_key
    from gate.analysis.sequences import count_bounds as count_bounds
    from gate.analysis.sequences import min_samples_for_finite as min_samples_for_finite
    from gate.analysis.sequences import quantile_cs as quantile_cs
    from gate.analysis.sequential import Look as Look
    from gate.analysis.sequential import SequentialJudge as SequentialJudge
    from gate.analysis.types import ArmSamples as ArmSamples
    from gate.analysis.types import Check as Check
    from gate.analysis.types import EngineFacts as EngineFacts
    from gate.analysis.types import ScenarioSamples as ScenarioSamples
    from gate.analysis.types import Verdict as Verdict
