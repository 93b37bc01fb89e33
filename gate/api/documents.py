"""The shapes of the API's larger JSON answers, for the OpenAPI document.

The verdict document, a re-judged verdict, capacity and inventory are built by the services as
plain JSON (they are stored and rendered as such); these models describe them for clients and
`/v1/openapi.json`. Fields the services may add later are allowed (`extra="allow"`), and the
API tests validate real answers against these models, so the description cannot drift from
what is served.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class CheckDoc(_Open):
    """One check: what was compared, the estimates, the interval, the threshold, the decision."""

    id: str = Field(description="e.g. steady.ttft.p50, startup.ready, crash.candidate")
    group: str | None = None
    scenario: str | None = None
    metric: str | None = None
    quantile: float | None = None
    reference: float | None = Field(description="the reference's estimate (ms, s or a rate)")
    candidate: float | None = Field(description="the candidate's estimate")
    ratio: float | None = Field(description="candidate / reference, for ratio checks")
    interval: list[float | None] | None = Field(
        description="the decision interval (anytime-valid); a null end is unbounded"
    )
    estimate_interval: list[float | None] | None = None
    threshold: float | None = None
    decision: Literal["pass", "fail", "inconclusive"]
    samples: list[int] = Field(description="[reference, candidate] samples judged")
    alpha: float | None = None
    message: str


class ReasonDoc(_Open):
    check: str
    message: str


class VerdictDocument(_Open):
    """Everything a gate decided and why: its checks with their evidence, the reasons for a
    hold, notes, scenarios, engines (phases, crashes, log tails) and the reservation."""

    gate_id: str
    name: str | None = None
    state: Literal["complete", "error", "cancelled"]
    verdict: Literal["continue", "hold"]
    reasons: list[ReasonDoc]
    checks: list[CheckDoc]
    notes: list[str]
    scenarios: list[dict[str, Any]] | None = None
    engines: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class RejudgeResult(_Open):
    gate_id: str
    verdict: Literal["continue", "hold"]
    original_verdict: Literal["continue", "hold"] | None
    checks: list[CheckDoc]
    reasons: list[CheckDoc]
    notes: list[str]
    policy: dict[str, Any] = Field(description="the policy judged by, defaults filled in")


class CapacityDoc(_Open):
    inventory: str
    shape: dict[str, Any]
    level: str | None = Field(description="the domain level gates are counted per")
    gates: int = Field(description="how many gates of this shape fit now")
    engines: int
    free_gpus: int
    eligible_nodes: int
    nodes: int
    gpus: int
    held_by_gates: int
    per_domain: list[dict[str, Any]]
    blocked: dict[str, Any] | None = Field(description="why none fits, layer by layer")
    elapsed_ms: float


class InventoryDoc(_Open):
    name: str
    nodes: list[dict[str, Any]]
    gpus: int
    held_by_gates: int
