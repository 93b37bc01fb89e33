"""The verdict document: everything a gate decided and why, as one typed model.

The runner builds it (also for errors and cancellations) and saves its JSON form, the CLI
prints it, the API returns it (OpenAPI describes it from these classes), the report renders
it and re-judge reads it back. Nothing else spells it as a dict.

Its JSON form (`to_json`) has the keys that were given when it was built: a full run's document
names every field (None where nothing applies), a gate the reaper ended has the few it knows.
Reading a stored document back (`read`) and writing it again gives the same JSON.

Unknown keys are refused: a typo in a builder fails a test instead of reaching users.

This module holds the top model and the verdict's own parts (checks, reasons, the error, the
history comparison); the engines and the reservation (document_engines.py), the load and
capacity scenarios (document_scenarios.py) and the probes and correctness scenarios
(document_correctness.py) are models beside it, re-exported here: every reader imports the
document's types from this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import Field, ValidationError, field_validator

from gate.core.errors import DocumentUnreadable
from gate.core.vocabulary import CheckDecision, FinishedState, GateDecision, Role
from gate.verdict.document_base import _Doc
from gate.verdict.document_correctness import (
    AbsDeltaDoc,
    Answered,
    CorrectnessDoc,
    DivergenceExample,
    EngineFailure,
    ProbeDivergenceDoc,
    ProbeDoc,
    ProbeSide,
)
from gate.verdict.document_engines import (
    CapabilitiesDoc,
    CrashDoc,
    EngineDoc,
    EngineSoftwareDoc,
    GpuDoc,
    GroupDoc,
    GroupPlacementDoc,
    KubernetesDoc,
    NodeGpus,
    PlacementDoc,
    PlatformDoc,
    ReservationBlocked,
    ReservationReleased,
)
from gate.verdict.document_scenarios import (
    CapacityDoc,
    CapacityEngineDoc,
    CapacityStepDoc,
    DistributionDoc,
    EarlyStopDoc,
    EngineTelemetryDoc,
    GoodputDoc,
    LengthsDoc,
    OutputExampleDoc,
    OutputsDoc,
    PhaseMark,
    RequestCountsDoc,
    RunSummaryDoc,
    ScenarioDoc,
    TelemetryDoc,
    ThroughputDoc,
    WorkloadDoc,
    WorkloadPartDoc,
)

__all__ = [
    "AbsDeltaDoc",
    "Answered",
    "CapabilitiesDoc",
    "CapacityDoc",
    "CapacityEngineDoc",
    "CapacityStepDoc",
    "CheckDoc",
    "CorrectnessDoc",
    "CrashDoc",
    "DistributionDoc",
    "DivergenceExample",
    "DocumentState",
    "EarlyStopDoc",
    "EndedElsewhere",
    "EngineDoc",
    "EngineFailure",
    "EngineSoftwareDoc",
    "EngineTelemetryDoc",
    "ErrorDoc",
    "GoodputDoc",
    "GpuDoc",
    "GroupDoc",
    "GroupPlacementDoc",
    "HistoryComparisonDoc",
    "KubernetesDoc",
    "LengthsDoc",
    "NodeGpus",
    "OutputExampleDoc",
    "OutputsDoc",
    "PhaseMark",
    "PlacementDoc",
    "PlatformDoc",
    "ProbeDivergenceDoc",
    "ProbeDoc",
    "ProbeSide",
    "ReasonDoc",
    "ReferenceOutlierDoc",
    "RejudgeResult",
    "RequestCountsDoc",
    "ReservationBlocked",
    "ReservationReleased",
    "RunSummaryDoc",
    "ScenarioDoc",
    "TelemetryDoc",
    "ThroughputDoc",
    "VerdictDocument",
    "WorkloadDoc",
    "WorkloadPartDoc",
]

MAX_READ_PROBLEMS = 5  # an unreadable document is named by its first few misfits


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
