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
power of both)."""

from gate.analysis.compat import ProbePair, ProbeResult
from gate.analysis.counts import (
    kind_mixture_pvalues,
    sequential_count_pvalue,
    sequential_count_pvalues,
)
from gate.analysis.divergence import (
    DivergenceSamples,
    GreedyPair,
    GreedyRun,
    Scored,
    TeacherForcedPair,
)
from gate.analysis.estimates import (
    bootstrap_ratio_intervals,
    hd_quantile,
    hd_quantiles,
    quantile_ratio,
)
from gate.analysis.judge import judge
from gate.analysis.load import OverloadPhase, PeakPhase, RequestLog, Slo
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy, quantile_key
from gate.analysis.sequences import count_bounds, min_samples_for_finite, quantile_cs
from gate.analysis.sequential import Look, SequentialJudge
from gate.analysis.types import ArmSamples, Check, EngineFacts, ScenarioSamples, Verdict

__all__ = [
    "ArmSamples",
    "Check",
    "DivergenceSamples",
    "EngineFacts",
    "GreedyPair",
    "GreedyRun",
    "Look",
    "OverloadPhase",
    "PeakPhase",
    "Plan",
    "Policy",
    "ProbePair",
    "ProbeResult",
    "RequestLog",
    "ScenarioSamples",
    "Scored",
    "SequentialJudge",
    "Slo",
    "TeacherForcedPair",
    "Verdict",
    "bootstrap_ratio_intervals",
    "count_bounds",
    "hd_quantile",
    "hd_quantiles",
    "judge",
    "kind_mixture_pvalues",
    "min_samples_for_finite",
    "quantile_cs",
    "quantile_key",
    "quantile_ratio",
    "sequential_count_pvalue",
    "sequential_count_pvalues",
]
