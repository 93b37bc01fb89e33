"""The verdict document: everything a gate decided and why, as one typed model.

The runner builds it (also for errors and cancellations) and saves its JSON form, the CLI
prints it, the API returns it (OpenAPI describes it from these classes), the report renders
it and re-judge reads it back. Nothing else spells it as a dict.

Its JSON form (`to_json`) has the keys that were given when it was built: a full run's document
names every field (None where nothing applies), a gate the reaper ended has the few it knows.
Reading a stored document back (`read`) and writing it again gives the same JSON.

Unknown keys are refused: a typo in a builder fails a test instead of reaching users.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gate.analysis.capacity import CapacitySearch, CapacityStep, EngineStep
from gate.core.errors import DocumentUnreadable
from gate.core.vocabulary import CheckDecision, FinishedState, GateDecision, Role

MAX_READ_PROBLEMS = 5  # an unreadable document is named by its first few misfits


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values, only the fields that were given (see the module docstring)."""
        return self.model_dump(mode="json", exclude_unset=True)


class CheckDoc(_Doc):
    """One check: what was compared, the estimates, the interval, the threshold, the decision."""

    id: str = Field(description="e.g. steady.ttft.p50, startup.ready, crash.candidate")
    group: str | None = None
    scenario: str | None = None
    metric: str | None = None
    quantile: float | None = None
    reference: float | None = Field(None, description="the reference's estimate (ms, s, a rate)")
    candidate: float | None = Field(None, description="the candidate's estimate")
    ratio: float | None = Field(None, description="candidate / reference, for ratio checks")
    interval: list[float | None] | None = Field(
        None, description="the decision interval (anytime-valid); a null end is unbounded"
    )
    estimate_interval: list[float | None] | None = Field(
        None, description="a 95% interval over the paired blocks, for people; it decides nothing"
    )
    threshold: float | None = None
    decision: CheckDecision
    samples: list[int] = Field(
        default_factory=lambda: [0, 0], description="[reference, candidate] samples judged"
    )
    alpha: float | None = None
    message: str
    required: bool = Field(
        True, description="an undecided check holds the gate only when it is required"
    )
    detectable: float | None = Field(
        None, description="the smallest ratio this gate could detect (80% power), paired checks"
    )
    correlation_requests: float | None = Field(
        None, description="correlation time of the pairs' log ratios, in requests"
    )
    block_requests: int | None = Field(
        None, description="requests per block of the paired test, fixed by the plan"
    )
    warning: str | None = Field(
        None,
        description=(
            "why this check is in the warning tier (it does not hold the gate, but a continue "
            "says it): past its warning threshold, an error rate above the ceiling without "
            "confidence, a test bed that looks unhealthy"
        ),
    )

    advisory: bool = Field(
        False,
        description=(
            "the policy's `advisory` names this check: judged as any other, it never holds "
            "the gate; one that would have is listed in the document's `advisory`"
        ),
    )

    @field_validator("decision", mode="before")
    @classmethod
    def _legacy_decision(cls, v: object) -> object:
        """Documents stored before judge v3 spell an undecided check 'inconclusive'."""
        return "undecided" if v == "inconclusive" else v


class ReasonDoc(_Doc):
    """A check (or what stopped the gate) and what to say about it: why a gate holds, a
    warning, or what a continue could not show."""

    check: str
    message: str


class ErrorDoc(_Doc):
    code: str = Field(description="the error's code, e.g. invalid_spec, deadline, worker_lost")
    message: str


class NodeGpus(_Doc):
    node: str
    gpus: list[int]


class GroupPlacementDoc(_Doc):
    """One worker group of an engine of several (prefill, decode): its nodes and GPUs."""

    role: str
    nodes: list[NodeGpus]
    sku: str | None = None
    domain: str | None = None


class PlacementDoc(_Doc):
    """Where an engine the gate launched ran. Kubernetes engines also name every node and the
    topology domain their GPUs share; an engine of several worker groups names each group's
    (`node` and `gpus` are then its first group's leader)."""

    node: str
    gpus: list[int]
    sku: str | None = None
    nodes: list[NodeGpus] | None = None
    domain: str | None = None
    groups: list[GroupPlacementDoc] | None = None


class GroupDoc(_Doc):
    """One process of an engine of several worker groups: a group's worker or the router."""

    role: str = Field(description="the group (prefill, decode) or `router`")
    url: str | None = None
    pid: int | None = None
    node: str | None = None
    gpus: list[int] = Field(default_factory=list)
    phases: dict[str, float] = Field(default_factory=dict)
    crashed: bool = False
    log: str | None = None
    log_tail: list[str] = Field(default_factory=list)


class KubernetesDoc(_Doc):
    namespace: str
    image: str
    workload: str = Field(description="Pod NAME or LeaderWorkerSet NAME")
    clique: str | None = None
    service_url: str | None = None
    lease: str | None = Field(None, description="the gate's Lease that owns every object")
    objects: list[str] = Field(default_factory=list, description="KIND namespace/name")


class CrashDoc(_Doc):
    at_s: float = Field(description="seconds into the gate")
    exit_code: int | None = None
    description: str
    log_tail: list[str] = Field(default_factory=list)


class CapabilitiesDoc(_Doc):
    """What the engine answered when asked at readiness (loadgen/capabilities.py)."""

    completions: bool = False
    chat: bool = False
    logprobs: bool = False
    top_logprobs_max: int | None = None
    prompt_logprobs: bool = False
    token_ids: bool = False
    prompt_token_ids: bool = False
    stream_usage: bool = False
    problems: list[str] = Field(default_factory=list, description="what each failed ask said")
    tokens_by_id: bool = Field(
        default=False,
        description="asked with vLLM's return_tokens_as_token_ids, it named tokens by id",
    )


class EngineDoc(_Doc):
    """One engine as the gate saw it: how it was run, its startup phases, a crash, its log."""

    kind: Literal["process", "endpoint", "kubernetes"]
    url: str | None = None
    pid: int | None = None
    placement: PlacementDoc | None = None
    kubernetes: KubernetesDoc | None = None
    phases: dict[str, float] = Field(
        default_factory=dict, description="phase -> seconds into the gate it was reached"
    )
    ready_s: float | None = Field(None, description="launch to ready; null for attached ones")
    crash: CrashDoc | None = None
    log: str | None = Field(None, description="the engine's log file (process engines)")
    log_tail: list[str] = Field(default_factory=list)
    capabilities: CapabilitiesDoc | None = Field(
        None, description="learned at readiness; null when the gate did not get that far"
    )
    groups: list[GroupDoc] | None = Field(
        None, description="an engine of several worker groups: each group and its router"
    )


class EngineSoftwareDoc(_Doc):
    """What one engine ran, as far as the gate could see: the version it answered on
    `/version` (vLLM's and the sim's, `{"version": ...}`), and for a Kubernetes engine the
    image and the digest the kubelet reported (`imageID`)."""

    version: str | None = Field(None, description="what GET /version answered; null: no answer")
    version_note: str | None = Field(None, description="why there is no version")
    program: str | None = Field(
        None, description="a process engine's program or preset (argv[0], `preset:vllm`)"
    )
    image: str | None = None
    image_digest: str | None = Field(None, description="the running container's imageID")


class GpuDoc(_Doc):
    model: str
    driver: str | None = None
    memory_mib: int | None = None


class PlatformDoc(_Doc):
    """The hardware and software a gate ran on, so the history can tell a test bed that
    changed from software that did. GPUs are the gate host's as `nvidia-smi` lists them;
    none listed says why (`gpu_note`, e.g. not visible: no nvidia-smi on this host)."""

    host: str
    gate_version: str
    python: str
    platform: str
    gpus: list[GpuDoc] = Field(default_factory=list)
    gpu_note: str | None = None
    engines: dict[Role, EngineSoftwareDoc] = Field(default_factory=dict)
    identity: str | None = Field(
        None, description="the spec's identity (name, model, shape) its history is kept by"
    )
    aa: bool | None = Field(
        None,
        description="an A/A gate: both engines specified alike (same argv, preset, image, url)",
    )


class ReferenceOutlierDoc(_Doc):
    """One of the reference's own figures far from its history (median and MAD)."""

    figure: str = Field(description="SCENARIO.METRIC.QUANTILE, e.g. steady.ttft_ms.p50")
    value: float
    median: float
    mad: float
    score: float = Field(description="|value - median| / (1.4826 MAD), floored (see docs)")


class HistoryComparisonDoc(_Doc):
    """This run's reference against the last gates of the same identity."""

    gates: int = Field(description="earlier gates compared with")
    figures: int = Field(0, description="reference figures compared")
    outliers: list[ReferenceOutlierDoc] = Field(default_factory=list)
    note: str | None = None


class ReservationReleased(_Doc):
    """The GPUs the gate held. `lost`: the lease ended while the gate held it (it could not
    be renewed, or was reaped): the gate stopped its engines, and says why here."""

    state: Literal["released", "lost"]
    id: int
    fence: int = Field(description="the fence token: reservation ids only ever grow")
    placement: dict[str, Any] = Field(description="every engine's node, GPUs and domain")
    lost: str | None = None


class ReservationBlocked(_Doc):
    """Nothing fitted: the first layer that left nothing, and what each layer removed."""

    state: Literal["blocked"]
    code: str
    message: str
    retryable: bool
    eliminated: dict[str, int] = Field(default_factory=dict)
    per_domain: list[dict[str, Any]] = Field(default_factory=list)


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
    stage: str = Field(description="ramp, bisect or confirm")
    reference: CapacityEngineDoc
    candidate: CapacityEngineDoc


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
    steps: list[CapacityStepDoc]

    def search(self) -> CapacitySearch:
        """The search as the judge reads it (analysis/capacity.py)."""

        def side(e: CapacityEngineDoc) -> EngineStep:
            return EngineStep(e.sent, e.good, e.ttft_p50_ms, e.itl_p50_ms)

        steps = [
            CapacityStep(
                s.rate, s.stage, {"reference": side(s.reference), "candidate": side(s.candidate)}
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
        )


class ProbeSide(_Doc):
    status: int | None = None
    ok: bool
    problems: list[str] = Field(default_factory=list)


class ProbeDoc(_Doc):
    """One compatibility probe, as each engine answered it."""

    name: str
    reference: ProbeSide
    candidate: ProbeSide


class Answered(_Doc):
    reference: int
    candidate: int
    reference_under_load: int | None = None  # absent from documents of older gates


class EngineFailure(_Doc):
    engine: Role
    message: str


class ProbeDivergenceDoc(_Doc):
    """One greedy probe, reference against candidate, where they first part (None: identical):
    both tokens with the logprob each engine gave its own, the reference's logprob of the
    candidate's token, and the reference's margin there."""

    probe: int
    first: int | None = None
    length: int = 0
    reference_token: str | None = None
    reference_logprob: float | None = None
    candidate_token: str | None = None
    candidate_logprob: float | None = None
    reference_logprob_of_candidate: float | None = Field(
        None, description="None: the candidate's token is outside the reference's top-k"
    )
    margin: float | None = None
    outside_top_k: bool = False


class AbsDeltaDoc(_Doc):
    """Teacher-forced |delta logprob| per position (rounded, at most 4,096 a side): reference
    vs candidate and the reference against itself, with the policy's floor."""

    candidate: list[float] = Field(default_factory=list)
    envelope: list[float] = Field(default_factory=list)
    floor_nat: float
    envelope_tolerance: float


class CorrectnessDoc(_Doc):
    """A correctness scenario: how many greedy probes each engine answered and matched."""

    name: str
    probes: int
    answered: Answered
    exact_matches: int
    envelope_exact_matches: int
    teacher_forced: int
    failures: list[EngineFailure] = Field(default_factory=list)
    probe_divergence: list[ProbeDivergenceDoc] = Field(default_factory=list)
    abs_delta_logprob: AbsDeltaDoc | None = None
    envelope_early: int = Field(
        0, description="envelope pairs that part before early_tokens (the load outputs' bar)"
    )
    envelope_pairs: int = Field(0, description="the reference's free-run pairs against itself")


class DivergenceExample(_Doc):
    """A greedy output where the candidate left the reference: the tokens around it."""

    prompt: str
    reference_tokens: list[str]
    candidate_tokens: list[str]
    index: int | None = Field(None, description="the first token that differs")
    margin: float | None = None
    outside_top_k: bool | None = None
    scenario: str | None = None


class EndedElsewhere(_Doc):
    """The reaper ended the gate while it ran (its heartbeat looked lost): that stands."""

    state: FinishedState
    reason: str | None = None


DocumentState = FinishedState | Literal["invalid"]


class VerdictDocument(_Doc):
    """Everything a gate decided and why: its checks with their evidence, the reasons for a
    hold, notes, scenarios, engines (phases, crashes, log tails) and the reservation.
    `state` "invalid" is the command line's answer to a spec refused before any gate began
    (then there is no `gate_id`)."""

    gate_id: str | None = None
    name: str | None = None
    model: str | None = None
    state: DocumentState
    verdict: GateDecision
    summary: str | None = Field(
        None,
        description=(
            "the verdict in one line, as every surface shows it (at most 140 characters): "
            "'continue', 'continue, with 2 warnings; not shown: TTFT p90 in steady within +10% "
            "(shown: at most +14%)', 'hold: 2 checks failed (...)'; absent from documents of "
            "older gates"
        ),
    )
    reasons: list[ReasonDoc]
    warnings: list[ReasonDoc] = Field(
        default_factory=list,
        description=(
            "checks in the warning tier that do not hold the gate: a continue says 'with N "
            "warnings' (absent from documents of older gates)"
        ),
    )
    not_shown: list[ReasonDoc] = Field(
        default_factory=list,
        description=(
            "undecided checks that do not hold the gate (not required): what a continue could "
            "not show, each with its tolerance and what was shown (absent from documents of "
            "older gates)"
        ),
    )
    advisory: list[ReasonDoc] = Field(
        default_factory=list,
        description=(
            "advisory checks (policy.advisory) that failed, or stayed undecided where "
            "required: shown apart from the reasons, they never hold the gate (absent from "
            "documents of older gates)"
        ),
    )
    checks: list[CheckDoc]
    notes: list[str]
    report: str | None = Field(None, description="the HTML report's path on the worker")
    document: str | None = Field(None, description="this document's JSON file beside it")
    error: ErrorDoc | None = None
    engines: dict[Role, EngineDoc] | None = None
    reservation: ReservationReleased | ReservationBlocked | None = Field(
        None, discriminator="state"
    )
    scenarios: list[ScenarioDoc] | None = None
    capacity: list[CapacityDoc] | None = Field(
        None, description="the capacity scenarios' searches over offered rate"
    )
    probes: list[ProbeDoc] | None = None
    correctness: list[CorrectnessDoc] | None = None
    divergence_examples: list[DivergenceExample] | None = None
    started_at: str | None = Field(None, description="ISO 8601, UTC")
    finished_at: str | None = Field(None, description="ISO 8601, UTC")
    duration_s: float | None = None
    exit_code: int | None = Field(None, description="what `gate run` exits with: 0, 1, 2, 130")
    ended_elsewhere: EndedElsewhere | None = None
    testbed: PlatformDoc | None = Field(
        None, description="the hardware and software it ran on (absent from older gates)"
    )
    history: HistoryComparisonDoc | None = Field(
        None, description="this run's reference against its identity's history"
    )

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> Self:
        """A stored document (the JSON column, a file) as the model; one that does not fit
        raises DocumentUnreadable naming the fields."""
        try:
            return cls.model_validate(stored)
        except ValidationError as exc:
            where = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
                for e in exc.errors()[:MAX_READ_PROBLEMS]
            )
            gate = stored.get("gate_id") if isinstance(stored, Mapping) else None
            raise DocumentUnreadable(
                f"the stored verdict document of gate {gate} does not fit this version: {where}"
            ) from None

    @property
    def reason_text(self) -> str | None:
        """The reasons as one line, as the gate row keeps them."""
        return " ".join(r.message for r in self.reasons) or None


class RejudgeResult(_Doc):
    """A finished gate's stored samples judged again under another policy."""

    gate_id: str
    verdict: GateDecision
    summary: str = Field(description="the verdict in one line, as the gate's own summary")
    original_verdict: GateDecision | None
    checks: list[CheckDoc]
    reasons: list[CheckDoc]
    warnings: list[ReasonDoc] = Field(default_factory=list)
    not_shown: list[ReasonDoc] = Field(default_factory=list)
    advisory: list[ReasonDoc] = Field(
        default_factory=list, description="advisory checks that failed: they hold nothing"
    )
    notes: list[str]
    policy: dict[str, Any] = Field(description="the policy judged by, defaults filled in")
