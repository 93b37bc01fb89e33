"""Statistical judge of the deploy gate: a pure core (numpy, scipy, pydantic; no I/O).

The gate collects samples and engine facts, and this package turns them into a verdict with
the evidence behind it. Modules: sequences (anytime-valid quantile confidence sequences),
counts (one-sided sequential test on error counts), estimates (Harrell-Davis point
estimates), policy (the user-facing settings), types (inputs and outputs), judge (the rules).
"""

from gate.analysis.counts import sequential_count_pvalue, sequential_count_pvalues
from gate.analysis.estimates import hd_quantile, hd_quantiles, quantile_ratio
from gate.analysis.judge import judge
from gate.analysis.policy import Policy, quantile_key
from gate.analysis.sequences import count_bounds, min_samples_for_finite, quantile_cs
from gate.analysis.types import ArmSamples, Check, EngineFacts, ScenarioSamples, Verdict

__all__ = [
    "ArmSamples",
    "Check",
    "EngineFacts",
    "Policy",
    "ScenarioSamples",
    "Verdict",
    "count_bounds",
    "hd_quantile",
    "hd_quantiles",
    "judge",
    "min_samples_for_finite",
    "quantile_cs",
    "quantile_key",
    "quantile_ratio",
    "sequential_count_pvalue",
    "sequential_count_pvalues",
]
