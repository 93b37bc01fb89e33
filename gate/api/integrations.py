"""Webhooks of the systems that call the gate: Flagger's canary hooks and a signed CI webhook.
(Argo Rollouts polls `POST /v1/gates:ensure` and `GET /v1/gates/{id}/verdict`, in gates.py.)"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gate.api.gates import ERRORS, CreateGate, VerdictSummary, caller_of, submit
from gate.core.errors import FieldProblem, SpecError
from gate.http.deps import CtxDep, authorize, request_token
from gate.integrations.callbacks import allowed
from gate.integrations.signatures import HEADER, verify
from gate.runs import store
from gate.runs.requests import resolve_spec

if TYPE_CHECKING:  # the store's rows, for annotations only
    from gate.models import GateRun, WebhookDelivery

router = APIRouter(tags=["integrations"])


# -- Flagger -----------------------------------------------------------------------------------


class FlaggerHook(BaseModel):
    """What Flagger POSTs to a webhook (metadata values are strings)."""

    name: str = Field(max_length=253)
    namespace: str = Field(max_length=63)
    phase: str = Field(default="", max_length=64)
    checksum: str = Field(default="", max_length=200)
    metadata: dict[str, str] = Field(default_factory=dict)


FlaggerType = Literal["confirm-rollout", "confirm-promotion", "rollback"]


def _flagger_gate(ctx: CtxDep, hook: FlaggerHook, caller: str) -> GateRun:
    """The gate of this canary revision: Flagger's checksum is the idempotency key, so every
    call of every hook for one revision sees the same gate."""
    md = hook.metadata
    candidate: dict[str, Any] | None = None
    if md.get("candidate_url"):
        candidate = {"url": md["candidate_url"]}
    elif md.get("candidate"):
        candidate = _engine_json(md["candidate"])
    reference = {"url": md["reference_url"]} if md.get("reference_url") else None
    if not md.get("spec"):
        raise SpecError(
            [FieldProblem("metadata.spec", "name the gate spec (a file in GATE_SPEC_DIR)")],
            "flagger",
        )
    spec = resolve_spec(
        ctx.settings,
        spec_name=md["spec"],
        reference=reference,
        candidate=candidate,
        candidate_image=md.get("candidate_image") or None,
        source="flagger",
    )
    revision = hook.checksum or store.spec_key(spec)
    key = store.scoped_key(
        "flagger", caller, f"{hook.namespace}/{hook.name}", revision, store.spec_key(spec)
    )
    run = submit(ctx, spec, "flagger", key, owner=caller)[0]
    return run


def _engine_json(text: str) -> dict[str, Any]:
    """`metadata.candidate`: a JSON object of finite numbers, shallow (an engine template and
    its parameters), or a 422 naming the field; never a 500 for a hostile string."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not a number")

    problem: str | None = None
    if len(text) > 20_000:
        problem = f"{len(text)} characters; an engine is at most 20000"
    elif text.count("[") + text.count("{") > 200:
        problem = "nested or repeated too deeply for an engine"
    else:
        try:
            value = json.loads(text, parse_constant=refuse)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            problem = f"not JSON: {getattr(exc, 'msg', str(exc))[:200]}"
        else:
            if isinstance(value, dict):
                return value
            problem = 'must be a JSON object, e.g. {"engine": "vllm-k8s", "params": {...}}'
    raise SpecError([FieldProblem("metadata.candidate", problem)], "flagger")


def _flagger_token(request: Request, ctx: CtxDep, hook: FlaggerHook) -> str:
    """Flagger cannot send headers: its token may come in `metadata.token` (keep the Canary
    object as secret as the token) or, behind a proxy that adds it, the Authorization header.
    Returns who asked (the token's digest), which scopes the gate's key."""
    token = request_token(request) or hook.metadata.get("token")
    authorize(ctx, token, "run")
    return caller_of(ctx, request, token)


@router.post(
    "/webhooks/flagger/{hook_type}",
    response_model=VerdictSummary,
    responses={
        **ERRORS,
        403: {"description": "not (yet) what this hook waits for; the body says why"},
    },
    summary="Flagger canary webhooks: confirm-rollout, confirm-promotion, rollback",
)
def flagger(hook_type: FlaggerType, hook: FlaggerHook, request: Request, ctx: CtxDep) -> Any:
    """confirm-rollout / confirm-promotion answer 200 only when the gate says continue (403
    with the reason while it runs or on hold: Flagger keeps waiting or halts); rollback
    answers 200 when the gate holds (Flagger then rolls back), 403 otherwise."""
    run = _flagger_gate(ctx, hook, _flagger_token(request, ctx, hook))
    summary = store.verdict_summary(run, ctx.settings.public_url)
    wanted = "hold" if hook_type == "rollback" else "continue"
    status = 200 if summary["verdict"] == wanted else 403
    return JSONResponse(VerdictSummary(**summary).model_dump(mode="json"), status_code=status)


# -- CI webhook --------------------------------------------------------------------------------


class Callback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2000, description="commit-status URL (must be allow-listed)")
    context: str = Field(default="llm-deploy-gate", max_length=200)


class CiDelivery(CreateGate):
    """The signed body: the delivery id and timestamp are inside it, so both are signed; the
    gate is given as to `POST /v1/gates`."""

    delivery_id: str = Field(min_length=1, max_length=128)
    timestamp: float = Field(
        allow_inf_nan=False, description="unix seconds when the delivery was made"
    )
    callback: Callback | None = None


class CiAccepted(BaseModel):
    delivery_id: str
    duplicate: bool
    gate: VerdictSummary


@router.post(
    "/webhooks/ci",
    response_model=CiAccepted,
    status_code=202,
    responses={
        200: {"model": CiAccepted, "description": "a redelivery: the same gate"},
        401: {"description": "bad or missing signature, or a delivery outside the time window"},
        404: {"description": "the CI webhook is not configured (no GATE_WEBHOOK_SECRET)"},
        422: ERRORS[422],
    },
    summary="Signed CI webhook: start a gate for a build (idempotent per delivery)",
)
async def ci_webhook(
    request: Request,
    ctx: CtxDep,
    x_hub_signature_256: Annotated[str | None, Header()] = None,
) -> Any:
    """HMAC-SHA256 of the raw body with the shared secret in `X-Hub-Signature-256:
    sha256=<hex>`; `timestamp` within GATE_WEBHOOK_MAX_AGE_S; a repeated `delivery_id` with the
    same content (the timestamp may be new) returns the gate of the first delivery (200) and
    starts nothing; the same id with other content is refused (409)."""
    secret = ctx.settings.webhook_secret
    if not secret:
        raise HTTPException(404, detail="the CI webhook is off: set GATE_WEBHOOK_SECRET")
    body = await request.body()
    if not verify(secret, body, x_hub_signature_256):
        raise HTTPException(401, detail=f"{HEADER}: missing or does not match the body")
    try:
        delivery = CiDelivery.model_validate_json(body)
    except ValidationError as exc:
        problems = [
            FieldProblem(".".join(str(p) for p in e["loc"]) or "(body)", e["msg"])
            for e in exc.errors()
        ]
        raise SpecError(problems, "webhook body") from None
    age = time.time() - delivery.timestamp
    if outside_window(age, ctx.settings.webhook_max_age_s):
        raise HTTPException(
            401,
            detail=f"timestamp: the delivery is {age:.0f}s old; the window is "
            f"{ctx.settings.webhook_max_age_s:.0f}s (replayed or clock skew)",
        )
    delivery_key = f"ci:{delivery.delivery_id}"
    digest = _content_digest(delivery)
    seen = store.find_delivery(ctx.factory, delivery_key)
    if seen is not None:
        return _duplicate(ctx, delivery, seen, digest)
    if delivery.callback and not allowed(delivery.callback.url, ctx.settings.callback_allow):
        raise SpecError(
            [FieldProblem("callback.url", "not on the callback allow-list (GATE_CALLBACK_ALLOW)")],
            "webhook body",
        )
    run, created = submit(
        ctx,
        delivery.resolve(ctx.settings, "webhook body"),
        "ci",
        hashlib.sha256(delivery_key.encode()).hexdigest(),
        delivery.callback.model_dump() if delivery.callback else None,
        owner="ci",
    )
    # False when a concurrent redelivery recorded it first; the gate is the same (same key)
    store.record_delivery(ctx.factory, delivery_key, "ci", digest, run.id)
    out = CiAccepted(
        delivery_id=delivery.delivery_id,
        duplicate=not created,
        gate=VerdictSummary(**store.verdict_summary(run, ctx.settings.public_url)),
    )
    return JSONResponse(out.model_dump(mode="json"), status_code=202 if created else 200)


def outside_window(age_s: float, max_age_s: float) -> bool:
    """Written so that NaN is outside: every comparison with NaN is false, so `abs(age) >
    max_age` would let a NaN timestamp in (gate.http.guards refuses NaN bodies first)."""
    return not abs(age_s) <= max_age_s


def _content_digest(delivery: CiDelivery) -> str:
    """What makes two deliveries the same: everything but the timestamp, so a CI job that
    retries its step (a fresh timestamp, signed anew) gets its first gate back, while the same
    id with anything else changed is refused. Replays stay bounded by the timestamp window."""
    content = delivery.model_dump(mode="json", exclude={"timestamp"})
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _duplicate(
    ctx: CtxDep, delivery: CiDelivery, seen: WebhookDelivery, digest: str
) -> JSONResponse:
    if seen.body_sha256 != digest:
        raise HTTPException(
            409, detail=f"delivery_id {delivery.delivery_id!r} was used for a different body"
        )
    run = store.get_gate(ctx.factory, seen.gate_id) if seen.gate_id else None
    if run is None:
        raise HTTPException(410, detail="the gate of this delivery was deleted")
    out = CiAccepted(
        delivery_id=delivery.delivery_id,
        duplicate=True,
        gate=VerdictSummary(**store.verdict_summary(run, ctx.settings.public_url)),
    )
    return JSONResponse(out.model_dump(mode="json"), status_code=200)
