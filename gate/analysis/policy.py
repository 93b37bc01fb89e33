"""The statistical policy a gate spec embeds: error budget, tolerances and checks.

Weighted Bonferroni (see statistics.md, "Many checks at once"): each budget group j gets
alpha * w_j with the weights summing to 1, split evenly over the group's checks, which controls
the family-wise false-hold rate under any dependence between checks and under optional
stopping, because every test inside is anytime-valid (or, for the few tests that are evaluated
once, valid at that one time).

Budget groups and the checks that spend them:
    latency: paired quantile checks (scenario x metric x quantile, latency.py);
    tail: paired tail checks (scenario x metric: the slowest 5% as a whole, latency.py);
    errors: the error count test of each scenario (all kinds and per kind, one mixture);
    correctness: the statistical divergence tests (teacher-forced scoring, free-run greedy);
    load: goodput under peak and collapse under overload;
    startup: startup phases compared across repeated launches.
Deterministic rules (crashes, restarts, OOM, NaN logprobs, empty or runaway outputs, probe
compatibility, single-launch startup, recovery time) spend nothing: they hold on facts.

This module holds the budget, the latency checks' settings and the rules between fields; the
tolerances of the load, tail, divergence, engine and GPU checks are its sections
(policy_sections.py), re-exported here.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gate.analysis.advisory import is_latency_key, pattern_problem, unmatched
from gate.analysis.check_keys import QUANTILE_KEY as _KEY
from gate.analysis.check_keys import (
    Metric,
    check_key,
    key_problem,
    matches_key,
    quantile_key,
)
from gate.analysis.policy_sections import (
    DivergencePolicy,
    EnginePolicy,
    GpuPolicy,
    LoadPolicy,
    TailPolicy,
)

__all__ = [
    "AUTO_QUANTILES",
    "BUDGET_GROUPS",
    "CHECK_GROUPS",
    "DEFAULT_ERROR_KINDS",
    "DivergencePolicy",
    "EnginePolicy",
    "GpuPolicy",
    "LoadPolicy",
    "Metric",
    "Policy",
    "TailPolicy",
    "check_key",
    "quantile_key",
]

AUTO_QUANTILES: tuple[float, ...] = (0.5, 0.9)
CHECK_GROUPS: tuple[str, ...] = ("latency", "errors", "correctness")
"""Budget groups a spec must weigh (the original three; older specs give exactly these)."""
OPTIONAL_GROUPS: tuple[str, ...] = ("load", "startup", "tail", "engine")
"""Budget groups that may be left out of alpha_split: left out, they weigh 0 and their
statistical checks are skipped with a note (weight 0 is how a spec turns a group off)."""
BUDGET_GROUPS: tuple[str, ...] = CHECK_GROUPS + OPTIONAL_GROUPS

DEFAULT_ERROR_KINDS: tuple[str, ...] = (
    "connect",
    "timeout",
    "http_4xx",
    "http_5xx",
    "stream_error",
    "protocol_error",
    "truncated",
)

MAX_BOOTSTRAP_RESAMPLES = 20_000
MAX_QUANTILES = 8
MAX_ERROR_KINDS = 32


def _default_metrics() -> list[Metric]:
    return ["ttft", "itl"]


class Policy(BaseModel):
    """How strict the gate is. Defaults suit a mirrored-load comparison of a few hundred to a few
    thousand requests per scenario and arm."""

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(
        default=0.05,
        gt=0.0,
        lt=0.5,
        description=(
            "Family-wise false-hold budget: the probability that the gate holds a candidate "
            "that is as good as the reference, across all checks and however often it looks."
        ),
    )
    alpha_split: dict[str, float] = Field(
        default_factory=lambda: {
            "latency": 0.3,
            "tail": 0.1,
            "errors": 0.2,
            "correctness": 0.25,
            "load": 0.05,
            "startup": 0.05,
            "engine": 0.05,
        },
        description=(
            "Share of alpha per budget group (weighted Bonferroni), split evenly over the "
            "group's checks. Keys: latency, errors, correctness (required), load, startup, "
            "tail, engine (optional, 0 when left out: their statistical checks are then "
            "skipped with a note); weights >= 0 summing to 1, latency > 0. Latency and tail "
            "together keep the largest share (0.4) because they have the most checks and the "
            "smallest effects: 0.3 for the quantile checks (scenarios x metrics x "
            "quantiles), 0.1 for the tail checks (scenarios x metrics), the same alpha per "
            "check with the default quantiles; correctness next, since a numerical bug is "
            "the costliest miss; errors 0.2 already holds a doubled error rate within a few "
            "thousand requests; load, startup and engine (the preemption count test: "
            "engine_metrics.py) have one or two checks each."
        ),
    )
    quantiles: Literal["auto"] | list[float] = Field(
        default="auto",
        description=(
            "Latency quantiles to compare, each a paired check per scenario and metric "
            "(paired.py). 'auto' checks p50 and p90; the slowest requests are the tail check's "
            "(policy tail), which judges them as a whole instead of one noisy p99. At most 8. "
            "A quantile check left undecided does not hold the gate unless `require` lists it."
        ),
    )
    tolerance: dict[str, float] = Field(
        default_factory=lambda: {"p50": 0.05, "p90": 0.10, "p99": 0.10},
        validate_default=True,
        max_length=MAX_QUANTILES * 2,
        description=(
            "Allowed relative increase of the candidate over the reference per quantile, keyed "
            "'p50', 'p90', 'p99', 'p99.9'; 0.10 allows the candidate up to 1.10x. The p99 "
            "default is 10%, not more: a tolerance equal to the smallest tail regression the "
            "gate must catch (15%) could never hold it, since its true ratio would sit on the "
            "threshold."
        ),
    )
    require: list[Annotated[str, Field(min_length=1, max_length=32)]] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Latency and tail checks that must be decided: one listed here that ends undecided "
            "holds the gate (and may extend its scenario); one not listed holds only on "
            "evidence of a regression, and an undecided one is reported with the smallest "
            "regression the gate could have detected at its size. Keys: 'ttft.p50', "
            "'itl.p90', 'ttft.tail', or 'p50' / 'tail' for every metric. Empty by default: "
            "a gate that cannot tell is not evidence against the candidate, and a gate that "
            "holds identical engines gets switched off."
        ),
    )
    advisory: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Checks computed and shown but never holding (Argo Rollouts' dryRun metrics): "
            "how a new check comes in without blocking rollouts. The verdict lists the "
            "advisory checks that failed apart from its reasons, on every surface. Each entry "
            "is a `require` key ('ttft.p90', 'tail': those latency checks in every scenario) "
            "or a check id with '*' and '?' wildcards ('steady.ttft.p90', 'startup.phase.*', "
            "'compat.capability.*'); one that matches no check the gate can make is refused. "
            "gate.environment and latency.coverage are never advisory."
        ),
    )
    detect: dict[str, float] = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "Regressions the gate should be able to catch, e.g. {'ttft.p50': 0.05, 'tail': "
            "0.15}: the plan prints, for each, the planned requests per engine needed to "
            "detect it with 80% power (assuming `noise`), beside what the planned size "
            "detects. Keys as in `require`; values are relative increases in (0, 10]."
        ),
    )
    noise: float = Field(
        default=0.3,
        gt=0.0,
        le=5.0,
        description=(
            "Planning assumption: the standard deviation of one mirrored pair's log latency "
            "ratio (candidate over reference). 0.3 is a busy engine's TTFT under mirrored "
            "load; ITL is usually quieter. It sizes the plan's 'can detect' figures only; "
            "the checks measure the real spread from the data."
        ),
    )
    metrics: list[Metric] = Field(
        default_factory=_default_metrics,
        description=(
            "Latency metrics to compare: ttft (time to first token), itl (mean inter-token "
            "latency per request), e2e (send to last token). e2e is off by default: with a "
            "fixed output length it is TTFT + (tokens - 1) x ITL, so it adds no evidence "
            "but would take a third of the latency budget from the two that carry it."
        ),
    )
    extend: float = Field(
        default=0.5,
        ge=0.0,
        le=4.0,
        description=(
            "When a steady scenario reaches its planned requests and would hold only because "
            "a check is still undecided (none failed), it keeps running for up to this "
            "fraction more requests per arm, and stops at the first look where nothing is "
            "undecided; what is still undecided then is inconclusive (hold). 0 never extends. "
            "The checks keep their tuning and alpha: the confidence sequences hold at every "
            "size, so looks past the plan cost no false holds, and only gates that could not "
            "decide pay the extra time."
        ),
    )
    beta: float = Field(
        default=0.05,
        gt=0.0,
        lt=0.5,
        description=(
            "The pass side of every latency check: a check passes (the candidate is shown "
            "within tolerance) when its upper bound at this level is below the threshold, "
            "spent over the plan's looks. It bounds how often a candidate exactly at a "
            "tolerance is passed by one check; a scenario whose checks all pass stops early "
            "(a clean gate needs not run to its planned size). 5%: a continue shown at 95%."
        ),
    )
    window_tolerance: float = Field(
        default=0.5,
        gt=0.0,
        le=10.0,
        description=(
            "The window check (windows.py): fails when some run of consecutive time blocks "
            "(one block up to half the scenario) is, paired request by request, slower than "
            "1 + window_tolerance with confidence: a stall, a slow quarter of the gate. 50% is "
            "far above what a drift of +-5% per engine reaches in one block (so a clean run "
            "can be shown below it block by block, and stop early), and far below a stall "
            "(seconds of waiting on requests of tens of milliseconds) or a quarter at x2."
        ),
    )
    creep_tolerance: float = Field(
        default=0.10,
        gt=0.0,
        le=10.0,
        description=(
            "The creep check (windows.py): a line through the paired block ratios against "
            "time; fails when its value at the end of what was seen is above 1 + "
            "creep_tolerance with confidence: a slowdown that creeps in (a leak, "
            "fragmentation) is judged by where it got to, not by its average. 10%, the p90 "
            "tolerance: the end of a line is known about half as well as a mean."
        ),
    )
    short_scenarios: Literal["refuse", "allow"] = Field(
        default="refuse",
        description=(
            "A load scenario too short for the paired checks to decide anything (fewer than "
            "8 time blocks at its planned size: paired.MIN_BLOCKS) is refused before the load "
            "with the size it needs; 'allow' runs it anyway, its latency checks left "
            "undecided and said so."
        ),
    )
    look_every: int = Field(
        default=500,
        ge=10,
        le=1_000_000,
        description=(
            "Requests per arm between looks of the sequential judge. Looks are free for "
            "validity (the confidence sequences hold at every sample size); the grid only "
            "bounds the work, and 500 is a few seconds of load at typical rates. At least 10: "
            "each look judges the whole prefix so far, so a look per request would cost the "
            "square of the scenario's size."
        ),
    )
    bootstrap_resamples: int = Field(
        default=200,
        ge=20,
        le=MAX_BOOTSTRAP_RESAMPLES,
        description=(
            "Deprecated, read so that stored specs still parse: since judge v2 (issue 17) "
            "each latency check's estimate interval is a 95% t interval over the plan's "
            "blocks of paired requests, which needs no resampling."
        ),
    )
    bootstrap_block_s: float = Field(
        default=20.0,
        ge=0.1,
        le=86_400.0,
        description=(
            "Deprecated, read so that stored specs still parse: the paired checks' blocks are "
            "fixed by the plan in time from the schedule (paired.Layout)."
        ),
    )
    error_kinds: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=lambda: list(DEFAULT_ERROR_KINDS),
        max_length=MAX_ERROR_KINDS,
        description=(
            "Error kinds that get their own count test inside the errors budget; any other "
            "kind shares one 'other' test. Fixed in the policy (not taken from the data), so "
            "the weights of the tests do not depend on what happened. At most 32, each a test "
            "per scenario."
        ),
    )
    error_kind_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "Share of each scenario's error evidence given to the per-kind tests (split over "
            "error_kinds plus 'other'); the rest goes to the test over all errors. Half and "
            "half: a new error kind hidden among common ones is caught by its own test, and a "
            "general rise by the pooled one, each losing only log 2 of evidence."
        ),
    )
    error_burst_s: float = Field(
        default=2.0,
        ge=0.0,
        le=3_600.0,
        description=(
            "Errors of one engine that follow each other by less than this many seconds "
            "are one episode, one event in the count test: fifteen timeouts of one stall, or "
            "a bad period of ten seconds, are one event, not many independent coins (judge v2 "
            "held identical engines with 10 s bad periods 12-28% of the time). 2 s chains what "
            "fails together at the rates a bad period has (an error every second or faster) "
            "and leaves independent errors at a 1% rate and 20 requests/s mostly apart; 0 "
            "counts every error."
        ),
    )
    max_error_rate: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description=(
            "Absolute ceiling on the candidate's error fraction in each scenario, applied in "
            "addition to the statistical comparison with the reference: it holds only when "
            "the candidate's rate is above it with confidence (an anytime-valid test), and "
            "when the reference's is, the gate holds on the environment (`gate.environment`) "
            "instead of blaming the candidate."
        ),
    )
    error_tolerance: float = Field(
        default=0.01,
        ge=0.0,
        lt=1.0,
        description=(
            "How much more of its requests the candidate may fail than the reference, in "
            "absolute terms, for a scenario to stop early: before its planned end a scenario "
            "stops with a continue only when its errors give no evidence of a regression and "
            "the candidate's failed share so far is at most this above the reference's (and "
            "under the ceiling). It never holds anything: a hold needs the count test's "
            "evidence or the ceiling's. One point, the ceiling: with errors in episodes, a "
            "burst of four in a thousand requests is already 0.4 points."
        ),
    )
    startup_tolerance: float = Field(
        default=0.5,
        ge=0.0,
        description=(
            "The candidate may take up to (1 + startup_tolerance) x the reference's time to "
            "become ready, plus startup_slack_s."
        ),
    )
    startup_slack_s: float = Field(
        default=5.0,
        ge=0.0,
        description="Seconds added to the startup allowance so that fast engines are not held "
        "for a few seconds of jitter.",
    )
    startup_phase_slack_s: float = Field(
        default=2.0,
        ge=0.0,
        description=(
            "Seconds added to each startup phase's allowance ((1 + startup_tolerance) x the "
            "reference's duration + this): phases are shorter than the whole launch, so "
            "their jitter is too."
        ),
    )
    startup_host_busy: float | None = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description=(
            "Engines run as processes on the gate's host share its CPUs with whatever else "
            "runs there (a CI runner's other jobs). When work other than the gate's engines "
            "kept at least this share of the host's CPUs busy during an engine's launch "
            "(kernel counters, less the engines' own CPU time: gate/telemetry/host_cpu.py), "
            "that launch's duration is not the engine's alone, by about the longest any of its "
            "threads waited for a CPU: the startup rules the candidate fails by no more than "
            "that wait together, or passes only thanks to the reference's, are reported as "
            "not shown instead of deciding (gate/analysis/engines.py). null: no guard. Not "
            "measured for Kubernetes or attached engines."
        ),
    )
    load: LoadPolicy = Field(
        default_factory=LoadPolicy, description="Peak, overload and recovery tolerances."
    )
    tail: TailPolicy = Field(
        default_factory=TailPolicy,
        description="The tail check: the slowest requests as a whole (latency.py).",
    )
    engine: EnginePolicy = Field(
        default_factory=EnginePolicy,
        description="The engine checks: preemptions, KV capacity, prefix cache, spec decode, "
        "queue depth (engine_metrics.py).",
    )
    divergence: DivergencePolicy = Field(
        default_factory=DivergencePolicy,
        description="Numerical divergence thresholds (teacher-forced and free-run greedy).",
    )
    gpu: GpuPolicy = Field(
        default_factory=GpuPolicy,
        description="GPU memory and energy per token tolerances (analysis/gpu.py).",
    )
    warmup_requests: int = Field(
        default=8,
        ge=0,
        le=100_000,
        description="Requests discarded at the start of each scenario (compilation, CUDA graph "
        "capture); the gate applies it before judging.",
    )

    @field_validator("alpha_split")
    @classmethod
    def _check_split(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(BUDGET_GROUPS))
        if unknown:
            raise ValueError(
                f"unknown check group(s) {unknown}; expected {list(CHECK_GROUPS)} and "
                f"optionally {list(OPTIONAL_GROUPS)}"
            )
        missing = [g for g in CHECK_GROUPS if g not in v]
        if missing:
            raise ValueError(f"missing weight(s) for {missing}; give all of {list(CHECK_GROUPS)}")
        for key, w in v.items():
            if not (math.isfinite(w) and w >= 0.0):
                raise ValueError(f"weight for {key!r} must be >= 0, got {w}")
        if v["latency"] <= 0.0:
            raise ValueError("the latency weight must be > 0: a gate continues only on latency")
        total = math.fsum(v.values())
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"weights must sum to 1, got {total:g}")
        return v

    @field_validator("quantiles")
    @classmethod
    def _check_quantiles(cls, v: Literal["auto"] | list[float]) -> Literal["auto"] | list[float]:
        if v == "auto":
            return v
        if not v:
            raise ValueError("list at least one quantile, or use 'auto'")
        if len(v) > MAX_QUANTILES:
            raise ValueError(f"list at most {MAX_QUANTILES} quantiles, got {len(v)}")
        for q in v:
            if not 0.0 < q < 1.0:
                raise ValueError(f"quantiles must be in (0, 1), got {q}")
        if len({quantile_key(q) for q in v}) != len(v):
            raise ValueError("quantiles must be distinct")
        return sorted(v)

    @field_validator("tolerance")
    @classmethod
    def _check_tolerance(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, tol in v.items():
            m = _KEY.match(key)
            if m is None or not 0.0 < float(m.group(1)) < 100.0:
                raise ValueError(f"key {key!r} is not a quantile key like 'p90'")
            if not (math.isfinite(tol) and tol >= 0.0):
                raise ValueError(f"tolerance for {key!r} must be >= 0, got {tol}")
            out[quantile_key(float(m.group(1)) / 100.0)] = tol
        quantiles = info.data.get("quantiles", "auto")
        wanted = AUTO_QUANTILES if quantiles == "auto" else quantiles
        missing = [quantile_key(q) for q in wanted if quantile_key(q) not in out]
        if missing:
            raise ValueError(f"no tolerance for {missing}, which the quantiles setting checks")
        return out

    @field_validator("require")
    @classmethod
    def _check_require(cls, v: list[str]) -> list[str]:
        for key in v:
            problem = key_problem(key)
            if problem is not None:
                raise ValueError(problem)
        if len(set(v)) != len(v):
            raise ValueError("require lists a check twice")
        return v

    @field_validator("advisory")
    @classmethod
    def _check_advisory(cls, v: list[str]) -> list[str]:
        for i, pattern in enumerate(v):
            problem = pattern_problem(pattern)
            if problem is not None:
                raise ValueError(f"[{i}] {problem}")
        if len(set(v)) != len(v):
            raise ValueError("advisory lists a pattern twice")
        return v

    @field_validator("detect")
    @classmethod
    def _check_detect(cls, v: dict[str, float]) -> dict[str, float]:
        for key, shift in v.items():
            problem = key_problem(key)
            if problem is not None:
                raise ValueError(problem)
            if not (math.isfinite(shift) and 0.0 < shift <= 10.0):
                raise ValueError(
                    f"detect[{key!r}] must be a relative increase in (0, 10], got {shift}"
                )
        return v

    @field_validator("metrics")
    @classmethod
    def _check_metrics(cls, v: list[Metric]) -> list[Metric]:
        if not v:
            raise ValueError("list at least one metric")
        if len(set(v)) != len(v):
            raise ValueError("metrics must be distinct")
        return v

    @field_validator("error_kinds")
    @classmethod
    def _check_kinds(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("error kinds must be distinct")
        if "other" in v:
            raise ValueError("'other' is the bucket for unlisted kinds; do not list it")
        return v

    @property
    def checked_quantiles(self) -> tuple[float, ...]:
        """The quantiles the judge considers (auto: the candidates it may drop)."""
        return AUTO_QUANTILES if self.quantiles == "auto" else tuple(self.quantiles)

    def tolerance_for(self, q: float) -> float:
        """Allowed relative increase at quantile q (validated to exist for every checked q)."""
        return self.tolerance[quantile_key(q)]

    @model_validator(mode="after")
    def _check_keys_name_checks(self) -> Policy:
        """Every `require` and `detect` key must name a check this policy plans: a key that
        matches nothing would silently require nothing."""
        keyed = (
            ("require", list(self.require)),
            ("detect", list(self.detect)),
            ("advisory", [p for p in self.advisory if is_latency_key(p)]),
        )
        for field_name, keys in keyed:
            for key in keys:
                metric, dot, what = key.rpartition(".")
                if not dot:
                    metric, what = "", key
                if metric and metric not in self.metrics:
                    raise ValueError(
                        f"{field_name}: {key!r} names metric {metric!r}, which metrics "
                        f"{list(self.metrics)} does not judge"
                    )
                if what in ("window", "creep"):
                    continue
                if what == "tail":
                    if self.group_alpha("tail") <= 0.0:
                        raise ValueError(
                            f"{field_name}: {key!r} names the tail check, which alpha_split "
                            "turns off (no tail weight)"
                        )
                    continue
                wanted = quantile_key(float(what[1:]) / 100.0)
                if wanted not in {quantile_key(q) for q in self.checked_quantiles}:
                    raise ValueError(
                        f"{field_name}: {key!r} names {wanted}, which the quantiles setting "
                        f"does not check (it checks "
                        f"{[quantile_key(q) for q in self.checked_quantiles]})"
                    )
        return self

    @model_validator(mode="after")
    def _check_advisory_matches(self) -> Policy:
        """Every advisory pattern must match a check the judge can make under this policy
        (a typo would leave the check blocking): the families of `advisory.families`."""
        for i, why in unmatched(self.advisory, self):
            raise ValueError(f"advisory[{i}]: {why}")
        return self

    def requires(self, metric: str, q: float | None, kind: str = "tail") -> bool:
        """Whether an undecided check of this metric and quantile (None: the `kind`) holds."""
        return matches_key(self.require, metric, q, kind)

    def detect_for(self, metric: str, q: float | None, kind: str = "tail") -> float | None:
        """The regression the user wants this check to catch, if `detect` names it."""
        for key, shift in self.detect.items():
            if matches_key([key], metric, q, kind):
                return shift
        return None

    def group_alpha(self, group: str) -> float:
        """The share of the family-wise budget that one budget group may spend."""
        return self.alpha * self.alpha_split.get(group, 0.0)
