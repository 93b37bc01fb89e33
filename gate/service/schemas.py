"""What the gate service hands its readers: typed, to the last one.

`VerdictSummary` is the small object rollout controllers poll (`GET /v1/gates/{id}/verdict`,
`gates:ensure`, the CI and Flagger hooks) and the commit-status callback is built from; the
service returns it, the API serves it, the integrations read its attributes. `CallbackTarget`
is the commit-status callback a CI gate stores. `GateFilter` and `ServiceCounts` are what the
listing and `/metrics` ask and get.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypedDict

from pydantic import BaseModel, Field

from gate.core.vocabulary import GateState
from gate.verdict.document import ReasonDoc
from gate.verdict.history import HistoryEntry
from gate.verdict.summary import ANSWER_ITEMS

DEFAULT_CALLBACK_CONTEXT = "llm-deploy-gate"


class SaidInAnswer(TypedDict):
    """A gate's verdict in words as every answer about it carries it (its view, its polled
    summary): the one line, and each list at most ANSWER_ITEMS long with the rest counted."""

    summary: str | None
    warnings: list[ReasonDoc]
    warnings_omitted: int
    not_shown: list[ReasonDoc]
    not_shown_omitted: int
    advisory: list[ReasonDoc]
    advisory_omitted: int


class VerdictSummary(BaseModel):
    """What Argo Rollouts' web provider and other pollers read: 200 while running too.
    `verdict` decides (binary); `summary`, `warnings` and `not_shown` say it in words, the
    same words as the terminal, the report and the commit status (gate/verdict/summary.py)."""

    id: str
    state: GateState = Field(description="the gate's state, as `/v1/gates/{id}` names it")
    verdict: Literal["continue", "hold"] | None
    reason: str | None
    summary: str | None = Field(
        description="the verdict in one line (at most 140 characters), null until decided: "
        "'continue', 'continue, with 2 warnings; not shown: TTFT p90 in steady within +10% "
        "(shown: at most +14%)', 'hold: 2 checks failed (...)'"
    )
    warnings: list[ReasonDoc] = Field(
        description=f"checks in the warning tier (a continue 'with N warnings'), at most "
        f"{ANSWER_ITEMS}"
    )
    warnings_omitted: int = Field(description="warnings beyond those listed")
    not_shown: list[ReasonDoc] = Field(
        description=f"undecided checks that do not hold: what a continue could not show, at "
        f"most {ANSWER_ITEMS}"
    )
    not_shown_omitted: int = Field(description="not-shown checks beyond those listed")
    advisory: list[ReasonDoc] = Field(
        default_factory=list,
        description=f"advisory checks (policy.advisory) that failed: listed apart, they hold "
        f"nothing; at most {ANSWER_ITEMS}",
    )
    advisory_omitted: int = Field(0, description="advisory failures beyond those listed")
    report_url: str


class CallbackTarget(BaseModel):
    """A CI gate's commit-status callback, as stored on its row: where to POST the status and
    under which context (GitHub's `context`, GitLab's `name`)."""

    url: str
    context: str | None = None

    @property
    def status_context(self) -> str:
        return self.context or DEFAULT_CALLBACK_CONTEXT


@dataclass(frozen=True)
class GateFilter:
    """Which gates a listing asks for (all given fields must match), and which page."""

    state: str | None = None
    verdict: str | None = None
    candidate: str | None = None  # the start of the candidate's label
    name: str | None = None
    limit: int = 50
    offset: int = 0


@dataclass(frozen=True)
class ServiceCounts:
    """What /metrics reports from the database, read in one transaction."""

    gates: list[tuple[str, str | None, int]]  # state, verdict, count
    active_reservations: int
    gpus_held: int
    phases: list[tuple[str, str, str, float]]  # gate id, role, phase, at_s; in that order


class AlertPayload(BaseModel):
    """The generic JSON alert (gate/integrations/alerts.py): which gate, the engines
    compared, and the verdict summary every surface shows (its report link included)."""

    event: Literal["gate.finished"] = "gate.finished"
    name: str
    candidate: str | None
    reference: str | None
    verdict: VerdictSummary


class AlertDeliveryView(BaseModel):
    """One alert of a gate to one target, as recorded (`GET /v1/gates/{id}/alerts`): the
    target's name (an operator's) or `notify[i]` (a spec's own URL, never shown back), its
    format, which verdicts it hears, the delivery attempts (each up to three posts), the last
    HTTP status, whether it was sent, and what happened."""

    target: str
    format: str
    on: str
    attempts: int
    posts: int
    last_status: int | None
    sent: bool
    done: bool = Field(description="nothing more will be tried: sent, refused, not owed")
    result: str | None
    tried_at: datetime | None
    sent_at: datetime | None


class HistorySpec(BaseModel):
    """A spec identity with a history (gate/spec/identity.py): its latest name, how many
    finished gates it has, how many of them A/A, and when the last one finished."""

    identity: str
    name: str
    gates: int
    aa_gates: int
    last_finished_at: str | None


class HistoryList(BaseModel):
    items: list[HistorySpec]
    total: int
    limit: int
    offset: int


class AaRate(BaseModel):
    """The A/A gates of a page (both engines specified alike): how many held, and the rate,
    the gate's own false alarms on this test bed (null without A/A gates)."""

    gates: int
    holds: int
    hold_rate: float | None


class HistoryPage(BaseModel):
    """One spec identity's gates, newest first: the reference's own figures, every check's
    ratio and decision, the verdicts and what each ran on. `next_before` is the cursor of
    the next (older) page, null on the last."""

    identity: str
    name: str
    model: str | None
    shape: dict[str, object]
    total: int
    limit: int
    entries: list[HistoryEntry]
    next_before: str | None
    aa: AaRate
