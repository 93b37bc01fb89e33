"""The verdict document's load scenarios (document.py): each engine's run summary, the
early stop, the mirrored outputs compared, the engines' own telemetry, the workload sent, and
the capacity searches (which re-judge reads back as the judge's `CapacitySearch`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gate.analysis.capacity import CapacitySearch, CapacityStep, EngineStep
from gate.verdict.document_base import _Doc

__all__ = [
    "CapacityDoc",
    "CapacityEngineDoc",
    "CapacityStepDoc",
    "DistributionDoc",
    "EarlyStopDoc",
    "EngineTelemetryDoc",
    "GoodputDoc",
    "LengthsDoc",
    "OutputExampleDoc",
    "OutputsDoc",
    "PhaseMark",
    "RequestCountsDoc",
    "RunSummaryDoc",
    "ScenarioDoc",
    "TelemetryDoc",
    "ThroughputDoc",
    "WorkloadDoc",
    "WorkloadPartDoc",
]


class PhaseMark(_Doc):
    name: str
    start_s: float


class EarlyStopDoc(_Doc):
    requests: int = Field(description="requests per arm judged, after the warm-up")
    planned: int
    upto: int = Field(description="the schedule's first `upto` requests were judged")
    reason: Literal["hold", "decided", "planned"]
    checks: list[str]
    message: str


class OutputExampleDoc(_Doc):
    """A mirrored pair that parted: both outputs from a little before the first difference."""

    request_id: int
    position: int = Field(description="the token where they part (estimated on text)")
    reference: str
    candidate: str


class OutputsDoc(_Doc):
    """A load scenario's mirrored greedy outputs compared (gate/analysis/outputs.py)."""

    compared: int = Field(description="pairs both engines answered with output")
    exact: int = Field(description="pairs with identical outputs")
    early: int = Field(description="pairs that parted before `early_tokens`")
    early_tokens: int
    basis: Literal["token_ids", "text"]
    histogram: list[int] = Field(
        default_factory=list,
        description="pairs by first-divergence token, 0..63 (the last bin: 63 and later)",
    )
    examples: list[OutputExampleDoc] = Field(default_factory=list)
    blocks: list[tuple[int, int]] = Field(
        default_factory=list,
        description="(pairs, early) per block of consecutive requests, what the check tests",
    )


class DistributionDoc(_Doc):
    """Mean and p50/p90/p99 of a per-request measure, in ms; all null without samples."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class RequestCountsDoc(_Doc):
    sent: int
    ok: int
    errors: int
    resent: int | None = Field(
        None,
        description=(
            "requests sent once more on a fresh connection after the engine closed a "
            "kept-alive one under them, never errors (absent from documents of older gates)"
        ),
    )


class ThroughputDoc(_Doc):
    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None


class GoodputDoc(_Doc):
    """Requests that met every SLO: count, share of requests sent, and rate."""

    slos: dict[str, float]
    requests: int
    fraction: float | None = None
    requests_per_s: float | None = None


class RunSummaryDoc(_Doc):
    """What one engine served in a load scenario (loadgen.metrics.summarize): requests,
    errors by kind, latency quantiles, output tokens, throughput and, with SLOs, goodput.
    A stored document may lack the fields its gate's version did not write."""

    requests: RequestCountsDoc | None = None
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    ttft_ms: DistributionDoc | None = None
    itl_ms: DistributionDoc | None = None
    tpot_ms: DistributionDoc | None = None
    e2e_ms: DistributionDoc | None = None
    dispatch_delay_ms: DistributionDoc | None = None
    output_tokens: int | None = None
    duration_s: float | None = None
    throughput: ThroughputDoc | None = None
    goodput: GoodputDoc | None = None


class EngineTelemetryDoc(_Doc):
    """One engine's timeline over a scenario (gate/telemetry): seconds since the scenario
    started, and per series (the gate's vocabulary, gate/telemetry/vocabulary.py) one value per
    scrape, null where the scrape failed or lacked it. At most `DEFAULT_MAX_POINTS` scrapes
    and 64 series, so the document stays bounded."""

    sources: list[str] = Field(default_factory=list, description="what was read, e.g. its URL")
    t_s: list[float] = Field(default_factory=list)
    series: dict[str, list[float | None]] = Field(default_factory=dict)
    config: dict[str, str] = Field(
        default_factory=dict,
        description="the engine's configuration as its metrics state it: kv_cache_blocks, "
        "block_size, kv_cache_tokens, cache_dtype, prefix_caching",
    )
    gaps: int = Field(0, description="scrapes that failed (a gap, never an error)")
    notes: list[str] = Field(default_factory=list)


class TelemetryDoc(_Doc):
    """What both engines said about themselves while the scenario ran (null: not sampled)."""

    interval_s: float
    reference: EngineTelemetryDoc | None = None
    candidate: EngineTelemetryDoc | None = None
    gpu_note: str | None = Field(
        None, description="why an engine's GPUs were not read (no GPU visible, no exporter)"
    )

    def of(self, role: str) -> EngineTelemetryDoc | None:
        return self.reference if role == "reference" else self.candidate


class LengthsDoc(_Doc):
    """A distribution of lengths in tokens (words: exact on the sim, an estimate elsewhere):
    quantiles and a histogram (`counts[i]` between `edges[i]` and `edges[i+1]`)."""

    count: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    edges: list[float] = Field(default_factory=list)
    counts: list[int] = Field(default_factory=list)


class WorkloadPartDoc(_Doc):
    kind: str
    share: float
    file: str | None = None
    requests: int


class WorkloadDoc(_Doc):
    """What a scenario with a workload sent (gate/runs/workloads.py): its parts, how many
    sessions and later turns, prompt and output lengths, arrivals per bin of time."""

    parts: list[WorkloadPartDoc]
    requests: int
    sessions: int = 0
    later_turns: int = Field(
        default=0, description="turns sent with each engine's own earlier answers"
    )
    replay: str | None = Field(default=None, description="a trace's: recorded or time-scaled")
    prompt_tokens: LengthsDoc
    output_tokens: LengthsDoc = Field(description="the max_tokens each request asked for")
    arrivals_bin_s: float
    arrivals: list[int] = Field(description="first turns and requests starting per bin")
    notes: list[str] = Field(default_factory=list)


class ScenarioDoc(_Doc):
    """A load scenario: what each engine served (loadgen.metrics.summarize) and how it ended."""

    name: str
    duration_s: float
    aborted: bool = False
    phases: list[PhaseMark] = Field(default_factory=list)
    reference: RunSummaryDoc = Field(description="the reference's run summary")
    candidate: RunSummaryDoc = Field(description="the candidate's run summary, as reference's")
    planned_requests: int | None = None
    looks: int = 0
    early_stop: EarlyStopDoc | None = None
    outputs: OutputsDoc | None = Field(
        default=None, description="the mirrored outputs compared (temperature 0 only)"
    )
    telemetry: TelemetryDoc | None = Field(
        default=None, description="the engines' own metrics over the scenario (gate/telemetry)"
    )
    workload: WorkloadDoc | None = Field(
        default=None, description="what the scenario's workload sent (docs/workloads.md)"
    )


class CapacityEngineDoc(_Doc):
    """One engine at one step of a capacity search."""

    sent: int
    good: int = Field(description="requests that succeeded and met every SLO")
    goodput: float = Field(description="good / sent")
    ttft_p50_ms: float | None = None
    itl_p50_ms: float | None = None


class CapacityStepDoc(_Doc):
    rate: float = Field(description="the offered rate, requests/s, the same to both engines")
    stage: str = Field(description="ramp, bisect, decide or confirm")
    reference: CapacityEngineDoc
    candidate: CapacityEngineDoc
    host_cpu: float | None = Field(
        None,
        description="share of the gate host's CPUs busy during the step (None: not measured)",
    )
    cpu_stall: float | None = Field(
        None,
        description=(
            "share of the step's wall time in which some task of the gate's cgroup (else the "
            "host) waited for a CPU: Linux PSI (None: not measured)"
        ),
    )


class CapacityDoc(_Doc):
    """A capacity scenario: the paired search over offered rate, step by step."""

    name: str
    target: float = Field(description="the goodput share each engine must keep")
    slo: str = Field(description="the objectives a good request meets, in words")
    resolution: float
    require_decided: bool = False
    stopped: str = Field("", description="why the search ended")
    duration_s: float
    aborted: bool = False
    shares_host: bool = Field(
        False, description="both engines ran as processes on the gate's host without GPUs"
    )
    cpu_stall_limit: float | None = Field(
        None, description="policy.load.capacity_cpu_stall when the gate ran (the report's line)"
    )
    steps: list[CapacityStepDoc]

    def search(self) -> CapacitySearch:
        """The search as the judge reads it (analysis/capacity.py)."""

        def side(e: CapacityEngineDoc) -> EngineStep:
            return EngineStep(e.sent, e.good, e.ttft_p50_ms, e.itl_p50_ms)

        steps = [
            CapacityStep(
                s.rate,
                s.stage,
                {"reference": side(s.reference), "candidate": side(s.candidate)},
                s.host_cpu,
                s.cpu_stall,
            )
            for s in self.steps
        ]
        return CapacitySearch(
            self.name,
            self.target,
            self.resolution,
            steps,
            self.stopped,
            self.slo,
            self.require_decided,
            self.shares_host,
        )
