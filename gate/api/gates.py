"""`/v1/gates`: create, read, list, cancel, re-judge; the rollout controllers' small verdict
object. Thin: validation by pydantic and gate.spec, the work in gate.service."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gate.analysis.policy import Policy
from gate.core.clock import Timestamp
from gate.core.errors import DocumentUnreadable, GateConflict, SpecError
from gate.core.errors import TooBusy as TooBusy  # it lived here: re-exported
from gate.core.settings import Settings
from gate.core.vocabulary import FINISHED, GateState
from gate.http.deps import Ctx, CtxDep, ReadDep, RunDep, SessionSecret, request_token
from gate.service import alerts, service
from gate.service.admission import resolve_spec
from gate.service.rejudge import rejudge
from gate.service.schemas import AlertDeliveryView, CallbackTarget, GateFilter, VerdictSummary
from gate.spec import GateSpec, policy_problems
from gate.verdict import RejudgeResult, VerdictDocument, check_doc
from gate.verdict.document import ReasonDoc
from gate.verdict.summary import ANSWER_ITEMS, summarize

if TYPE_CHECKING:  # the service's rows, for annotations only
    from gate.models import GateRun

log = logging.getLogger(__name__)

router = APIRouter(tags=["gates"])

REJUDGE_CONCURRENCY = 2  # whole judges on request, per API process (each bounded by Policy)
_REJUDGES = threading.BoundedSemaphore(REJUDGE_CONCURRENCY)


State = GateState  # one name for a gate's state on every endpoint (gate/core/vocabulary.py)


class Links(BaseModel):
    self: str
    verdict: str
    document: str
    report: str


class Progress(BaseModel):
    model_config = ConfigDict(extra="allow")
    scenario: str | None = None
    done: int | None = None
    total: int | None = None


class GateView(BaseModel):
    id: str
    name: str
    state: State
    phase: str
    verdict: Literal["continue", "hold"] | None
    reason: str | None
    summary: str | None = Field(
        description="the verdict in one line, null until decided (as the verdict object's)"
    )
    warnings: list[ReasonDoc] = Field(
        description=f"as the verdict object's, at most {ANSWER_ITEMS}"
    )
    warnings_omitted: int = 0
    not_shown: list[ReasonDoc] = Field(
        description=f"as the verdict object's, at most {ANSWER_ITEMS}"
    )
    not_shown_omitted: int = 0
    advisory: list[ReasonDoc] = Field(
        default_factory=list, description=f"as the verdict object's, at most {ANSWER_ITEMS}"
    )
    advisory_omitted: int = 0
    source: str
    reference: str | None = Field(description="the reference engine's label")
    candidate: str | None = Field(description="the candidate engine's label")
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    attempts: int
    worker: str | None
    cancel_requested: bool
    progress: Progress | None
    callback: CallbackState | None = Field(
        default=None, description="the commit-status callback of a CI gate, and its delivery"
    )
    links: Links


class CallbackState(BaseModel):
    url: str
    context: str
    attempts: int
    sent_at: Timestamp | None
    result: str | None = Field(description="what the last attempt got, e.g. 'sent: HTTP 201'")


class GateList(BaseModel):
    total: int
    limit: int
    offset: int
    gates: list[GateView]


class CreateGate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any] | None = Field(default=None, description="a whole gate spec")
    spec_name: str | None = Field(default=None, description="a named spec in GATE_SPEC_DIR")
    reference: dict[str, Any] | None = Field(
        default=None, description="replaces the spec's reference engine"
    )
    candidate: dict[str, Any] | None = Field(
        default=None, description="replaces the spec's candidate engine"
    )
    reference_image: str | None = Field(
        default=None, max_length=500, description="replaces the image of a kubernetes reference"
    )
    candidate_image: str | None = Field(
        default=None, max_length=500, description="replaces the image of a kubernetes candidate"
    )

    def resolve(self, settings: Settings, source: str = "request") -> GateSpec:
        return resolve_spec(
            settings,
            spec=self.spec,
            spec_name=self.spec_name,
            reference=self.reference,
            candidate=self.candidate,
            reference_image=self.reference_image,
            candidate_image=self.candidate_image,
            source=source,
        )


class EnsureGate(CreateGate):
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="names a run of this spec: the gate is found by the SHA-256 of the "
        "resolved spec and this key, so the same body always names the same gate, and the "
        "same spec under another key (a retried rollout, `attempt-2`) is a new gate",
    )


class Rejudge(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: dict[str, Any] = Field(default_factory=dict, description="the policy to judge by")


class Problem(BaseModel):
    code: str
    message: str
    problems: list[dict[str, str]] | None = None


class ErrorBody(BaseModel):
    error: Problem


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no or unknown token"},
    403: {"model": ErrorBody, "description": "the token lacks the scope"},
    422: {"model": ErrorBody, "description": "the request or spec has mistakes"},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such gate"}
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorBody, "description": "not possible in the gate's state"}
}


def view(run: GateRun) -> GateView:
    base = f"/v1/gates/{run.id}"
    finished = run.state in FINISHED
    return GateView(
        id=run.id,
        name=run.name,
        state=run.state,
        phase=run.phase,
        verdict=run.verdict if finished else None,
        reason=run.reason,
        **service.said_in_answer(run, run.document),
        source=run.source,
        reference=run.reference_label,
        candidate=run.candidate_label,
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        attempts=run.attempts,
        worker=run.worker,
        cancel_requested=run.cancel_requested,
        progress=Progress(**run.progress) if run.progress else None,
        callback=_callback_state(run),
        links=Links(
            self=base,
            verdict=f"{base}/verdict",
            document=f"{base}/document",
            report=f"/gates/{run.id}",
        ),
    )


def _callback_state(run: GateRun) -> CallbackState | None:
    if not run.callback:
        return None
    target = CallbackTarget.model_validate(run.callback)
    return CallbackState(
        url=target.url,
        context=target.status_context,
        attempts=run.callback_attempts or 0,
        sent_at=run.callback_sent_at,
        result=run.callback_result,
    )


def caller_of(ctx: Ctx, request: Request, token: str | None = None) -> str:
    """Who asked: `token:<id>` of the API token presented (a bearer token, or the token a
    page session was made from), for owning gates and scoping idempotency keys; 401 when the
    credential names no live token (revoked since the route's check), never a shared
    anonymous identity."""
    credential = token or request_token(request)
    token_id: int | None = None
    if isinstance(credential, SessionSecret):
        session = ctx.sessions.lookup(credential)
        token_id = session.token_id if session is not None else None
    elif credential:
        token_id = ctx.tokens.token_id(credential)
    if token_id is None:  # the route let it through, but it names no live token now
        raise HTTPException(401, detail="unknown or revoked token")
    return f"token:{token_id}"


def submit(
    ctx: Ctx,
    spec: GateSpec,
    source: str,
    key: str | None,
    callback: dict[str, Any] | None = None,
    *,
    owner: str,
) -> tuple[GateRun, bool]:
    """Store the gate (or find the key's) and, when it is new, hand it to the workers. A new
    gate past the owner's share of active gates is refused (429). A broker that cannot take
    the task does not fail the request: the gate is stored, so the answer is its id (202),
    and the reapers queue it once the broker is back (GATE_REQUEUE_AFTER_S)."""
    run, created = service.create_gate(
        ctx.factory,
        spec,
        source=source,
        idempotency_key=key,
        callback=callback,
        owner=owner,
        max_active=ctx.settings.max_active_gates_per_token,
        alerts=alerts.plan(spec, ctx.settings),
    )
    if created:
        try:
            ctx.dispatcher.submit(run.id)
        except Exception as exc:
            log.warning(
                "gate %s stored, but the broker did not take its task (%s: %s); the reapers "
                "queue it when the broker is back",
                run.id,
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
                extra={"gate_id": run.id},
            )
    return run, created


@router.post(
    "/gates",
    status_code=202,
    response_model=GateView,
    responses={**ERRORS, 200: {"model": GateView, "description": "the key's existing gate"}},
    summary="Create a gate from a spec",
)
def create(
    body: CreateGate,
    ctx: CtxDep,
    _: RunDep,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=64)] = None,
) -> GateView:
    """Queue a gate; 202 with its id and links. With an `Idempotency-Key` header, a repeat
    returns the first gate (200) instead of starting another. Keys are per token: another
    token's key never names this gate; the same key with another spec is 409."""
    caller = caller_of(ctx, request)
    key = None
    if idempotency_key is not None:
        key = service.scoped_key("api", caller, idempotency_key)
    run, created = submit(ctx, body.resolve(ctx.settings), "api", key, owner=caller)
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/gates/{run.id}"
    return view(run)


@router.post(
    "/gates:ensure",
    response_model=VerdictSummary,
    responses=ERRORS,
    summary="Find or start the gate for this reference, candidate and spec (Argo Rollouts)",
)
def ensure(body: EnsureGate, ctx: CtxDep, _: RunDep, request: Request) -> VerdictSummary:
    """Idempotent: polling this with the same body and token never starts a second gate.
    Always 200 with the small verdict object; `verdict` is null until the gate is decided.
    The gate is this token's: another token with the same body gets its own gate."""
    spec = body.resolve(ctx.settings)
    parts = [service.spec_key(spec)]
    if body.key is not None:  # another run of the same spec, never another spec's gate
        parts.append(body.key)
    caller = caller_of(ctx, request)
    key = service.scoped_key("argo", caller, *parts)
    run = submit(ctx, spec, "argo", key, owner=caller)[0]
    return service.verdict_summary(run, ctx.settings.public_url)


@router.get("/gates", response_model=GateList, responses=ERRORS, summary="List gates")
def list_(
    ctx: CtxDep,
    _: ReadDep,
    state: State | None = None,
    verdict: Literal["continue", "hold"] | None = None,
    candidate: Annotated[str | None, Query(max_length=200)] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> GateList:
    """Newest first; `candidate` matches the start of the candidate engine's label."""
    rows, total = service.list_gates(
        ctx.factory,
        GateFilter(state, verdict, candidate, name, limit=limit, offset=offset),
    )
    return GateList(total=total, limit=limit, offset=offset, gates=[view(r) for r in rows])


@router.get(
    "/gates/{gate_id}",
    response_model=GateView,
    responses={**ERRORS, **NOT_FOUND},
    summary="A gate: state, current phase, progress",
)
def get(gate_id: str, ctx: CtxDep, _: ReadDep) -> GateView:
    return view(service.get_gate(ctx.factory, gate_id))


@router.get(
    "/gates/{gate_id}/verdict",
    response_model=VerdictSummary,
    responses={**ERRORS, **NOT_FOUND},
    summary="The small verdict object (200 while the gate runs; verdict null until decided)",
)
async def verdict(gate_id: str, ctx: CtxDep, _: ReadDep) -> Response:
    """What rollout controllers poll. A finished gate's answer never changes, so its encoded
    body is kept in memory after the first read; a running gate's is read from the database
    each time (five columns, encoded directly: the hot path of every poller)."""
    cache = ctx.finished_verdicts
    hit = cache.get(gate_id)
    if hit is None:
        summary = await run_in_threadpool(
            service.read_verdict, ctx.factory, gate_id, ctx.settings.public_url
        )
        hit = summary.model_dump_json().encode()
        if summary.state in FINISHED:  # its answer never changes again
            if len(cache) > 50_000:
                cache.clear()
            cache[gate_id] = hit
    return Response(hit, media_type="application/json")


class PhaseView(BaseModel):
    id: int = Field(description="increasing; pass the last one seen as `after`")
    role: Literal["gate", "reference", "candidate"]
    phase: str
    at_s: float = Field(description="seconds since the gate started (monotonic)")
    detail: str | None


@router.get(
    "/gates/{gate_id}/phases",
    response_model=list[PhaseView],
    responses={**ERRORS, **NOT_FOUND},
    summary="The gate's and its engines' lifecycle phases so far, in order",
)
def phases(
    gate_id: str,
    ctx: CtxDep,
    _: ReadDep,
    after: Annotated[int, Query(ge=0, le=2**62, description="only phases after this id")] = 0,
) -> list[PhaseView]:
    rows = service.list_phases(ctx.factory, gate_id, after)
    return [
        PhaseView(id=p.id, role=p.role, phase=p.phase, at_s=p.at_s, detail=p.detail) for p in rows
    ]


@router.get(
    "/gates/{gate_id}/alerts",
    response_model=list[AlertDeliveryView],
    responses={**ERRORS, **NOT_FOUND},
    summary="The gate's verdict alerts: each target, attempts, last HTTP status, sent or not",
)
def gate_alerts(gate_id: str, ctx: CtxDep, _: ReadDep) -> list[AlertDeliveryView]:
    return alerts.deliveries(ctx.factory, gate_id)


@router.get(
    "/gates/{gate_id}/document",
    responses={200: {"model": VerdictDocument}, **ERRORS, **NOT_FOUND, **CONFLICT},
    summary="The whole verdict document: every check with its evidence",
)
def document(gate_id: str, ctx: CtxDep, _: ReadDep) -> dict[str, Any]:
    run = service.get_gate(ctx.factory, gate_id)
    if run.document is None:
        raise GateConflict(f"gate {gate_id} is {run.state}; its document comes at the end")
    try:
        return VerdictDocument.read(run.document).to_json()
    except DocumentUnreadable as exc:  # stored by another version: what was stored stands
        log.warning("%s; serving it as stored", exc.message)
        return run.document


@router.post(
    "/gates/{gate_id}:cancel",
    response_model=GateView,
    status_code=202,
    responses={**ERRORS, **NOT_FOUND, **CONFLICT},
    summary="Cancel a gate (pending: at once; running: torn down at its next heartbeat)",
)
def cancel(gate_id: str, ctx: CtxDep, scopes: RunDep, request: Request) -> GateView:
    """Only the token that started the gate (or an admin token) may cancel it."""
    caller = caller_of(ctx, request)
    return view(
        service.request_cancel(ctx.factory, gate_id, caller=caller, admin="admin" in scopes)
    )


@router.post(
    "/gates/{gate_id}:rejudge",
    responses={200: {"model": RejudgeResult}, **ERRORS, **NOT_FOUND, **CONFLICT},
    summary="Judge a finished gate's stored samples under another policy",
)
def rejudge_(gate_id: str, body: Rejudge, ctx: CtxDep, _: RunDep) -> dict[str, Any]:
    """Nothing is launched or stored: the answer is the verdict the stored samples get under
    `policy` (the fields and defaults of a spec's `policy` section). Needs `run`: a whole
    judge over up to millions of stored requests is work the service does on request, which
    open reads (GATE_OPEN_READS) must not hand to anyone."""
    if not _REJUDGES.acquire(blocking=False):
        raise TooBusy(
            f"{REJUDGE_CONCURRENCY} re-judges are running; retry in a few seconds (a re-judge "
            "is a whole judge of a stored gate, so the service runs few at once)"
        )
    try:
        return _rejudge(gate_id, body, ctx)
    finally:
        _REJUDGES.release()


def _rejudge(gate_id: str, body: Rejudge, ctx: Ctx) -> dict[str, Any]:
    try:
        policy = Policy.model_validate(body.policy)
    except ValidationError as exc:
        raise SpecError(policy_problems(exc), "policy") from None
    verdict = rejudge(ctx.factory, gate_id, policy)
    run = service.get_gate(ctx.factory, gate_id)
    checks = [check_doc(c) for c in verdict.checks]
    said = summarize(verdict.decision, checks)
    return RejudgeResult(
        gate_id=gate_id,
        verdict=verdict.decision,
        summary=said.line(),
        original_verdict=run.verdict,
        checks=checks,
        reasons=[check_doc(c) for c in verdict.reasons],
        warnings=list(said.warnings),
        not_shown=list(said.not_shown),
        advisory=list(said.advisory),
        notes=list(verdict.notes),
        policy=policy.model_dump(mode="json"),
    ).to_json()
