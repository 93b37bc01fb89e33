"""Webhooks of the systems that call the gate: Flagger's canary hooks and a signed CI webhook.
(Argo Rollouts polls `POST /v1/gates:ensure` and `GET /v1/gates/{id}/verdict`, in gates.py.)"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gate.api.gates import ERRORS, CreateGate, caller_of, submit
from gate.core.errors import ClusterError, FieldProblem, SpecError
from gate.core.vocabulary import GateState
from gate.http.deps import CtxDep, authorize, request_token
from gate.integrations.callbacks import allowed
from gate.integrations.flagger import (
    HookType,
    RolloutImages,
    annotate,
    hook_answer,
    read_rollout,
)
from gate.integrations.signatures import HEADER, verify
from gate.service import service
from gate.service.admission import resolve_spec
from gate.service.schemas import VerdictSummary
from gate.spec import GateSpec, parse_spec
from gate.verdict.document import ReasonDoc

if TYPE_CHECKING:  # the service's rows, for annotations only
    from gate.models import WebhookDelivery

log = logging.getLogger("gate.integrations")
router = APIRouter(tags=["integrations"])


# -- Flagger -----------------------------------------------------------------------------------


MAX_METADATA_KEYS = 32  # the gate reads 9 (FLAGGER_METADATA); the others are refused by name
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 20_000  # the longest one the gate reads: `candidate`, an engine as JSON
MetadataKey = Annotated[str, StringConstraints(max_length=MAX_METADATA_KEY)]
MetadataValue = Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE)]


class FlaggerHook(BaseModel):
    """What Flagger POSTs to a webhook (metadata values are strings; webhook.go
    `CallWebhook`). The checksum is read and never used: it hashes the previous revision."""

    name: str = Field(max_length=253)
    namespace: str = Field(max_length=63)
    phase: str = Field(default="", max_length=64)
    checksum: str = Field(default="", max_length=200)
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict, max_length=MAX_METADATA_KEYS
    )


class FlaggerAnswer(BaseModel):
    """The hook's answer: the gate of the revision the target holds (null fields when there is
    none), and the images compared. The status code decides (binary); the body says it in the
    words every surface uses (`summary`, `warnings`, `not_shown`, `advisory`:
    gate/verdict/summary.py)."""

    id: str | None
    state: GateState | None
    verdict: Literal["continue", "hold"] | None
    reason: str | None
    summary: str | None = Field(description="the verdict in one line, null until decided")
    warnings: list[ReasonDoc] = Field(default_factory=list)
    warnings_omitted: int = 0
    not_shown: list[ReasonDoc] = Field(default_factory=list)
    not_shown_omitted: int = 0
    advisory: list[ReasonDoc] = Field(default_factory=list)
    advisory_omitted: int = 0
    report_url: str | None
    candidate: str | None = Field(description="the candidate image the gate runs")
    reference: str | None = Field(description="the reference image the gate runs")


FLAGGER_METADATA = (
    "spec",
    "token",
    "key",
    "container",
    "candidate_image",
    "reference_image",
    "candidate_url",
    "reference_url",
    "candidate",
)


def _flagger_metadata(hook: FlaggerHook) -> Mapping[str, str]:
    md = hook.metadata
    problems = [
        FieldProblem(
            f"metadata.{k[:64]}", "not a key the gate reads: " + ", ".join(FLAGGER_METADATA)
        )
        for k in md
        if k not in FLAGGER_METADATA
    ]
    if not md.get("spec"):
        problems.append(
            FieldProblem("metadata.spec", "name the gate spec (a file in GATE_SPEC_DIR)")
        )
    if len(md.get("key", "")) > 200:
        problems.append(FieldProblem("metadata.key", "at most 200 characters"))
    if problems:
        raise SpecError(problems, "flagger")
    return md


def _rollout(
    ctx: CtxDep, hook: FlaggerHook, md: Mapping[str, str], deadline: float
) -> RolloutImages | None:
    """What the Canary rolls out, from the cluster (GATE_FLAGGER_CLUSTER), or None when the
    gate reads no cluster."""
    where = ctx.settings.flagger_cluster
    if not where:
        return None
    if hook.namespace not in ctx.settings.flagger_namespaces:
        raise SpecError(
            [
                FieldProblem(
                    "namespace",
                    f"the gate does not read Canaries in {hook.namespace!r}: it is not on "
                    "GATE_FLAGGER_NAMESPACES",
                )
            ],
            "flagger",
        )
    api_client = _flagger_client(ctx)
    try:
        return read_rollout(
            api_client, hook.namespace, hook.name, md.get("container") or None, deadline=deadline
        )
    finally:
        api_client.close()


def _flagger_client(ctx: CtxDep) -> Any:
    from gate.reservations.kubernetes import connect

    where = ctx.settings.flagger_cluster or ""
    # No retries: a call gives up at its timeout, once, so the hook answers inside Flagger's 10 s
    if where == "in-cluster":
        return connect(in_cluster=True, retries=0)[0]
    return connect(kubeconfig=where, context=ctx.settings.flagger_context, retries=0)[0]


def _flagger_specs(
    ctx: CtxDep, md: Mapping[str, str], images: RolloutImages | None
) -> tuple[GateSpec, GateSpec]:
    """(the spec that names the revision, the spec the gate runs): the same but for the images,
    which the second pins by the digests the pods report. Metadata overrides the cluster."""
    candidate: dict[str, Any] | None = None
    if md.get("candidate_url"):
        candidate = {"url": md["candidate_url"]}
    elif md.get("candidate"):
        candidate = _engine_json(md["candidate"])
    reference = {"url": md["reference_url"]} if md.get("reference_url") else None

    def resolve(run: bool) -> GateSpec:
        cand_image = md.get("candidate_image") or None
        ref_image = md.get("reference_image") or None
        if images is not None:
            if cand_image is None and candidate is None:
                cand_image = images.candidate_run if run else images.candidate
            if ref_image is None and reference is None:
                ref_image = images.reference_run if run else images.reference
        return resolve_spec(
            ctx.settings,
            spec_name=md["spec"],
            reference=reference,
            candidate=candidate,
            candidate_image=cand_image,
            reference_image=ref_image,
            source="flagger",
        )

    named = resolve(run=False)
    pinned = images is not None and (images.candidate_digest or images.reference_digest)
    return named, (resolve(run=True) if pinned else named)


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


OVERRIDES = ("candidate_image", "reference_image", "candidate_url", "reference_url", "candidate")


def _flagger_key(
    caller: str,
    hook: FlaggerHook,
    md: Mapping[str, str],
    spec: GateSpec,
    images: RolloutImages | None,
) -> str:
    """The canary, the named spec, what the metadata overrides, the images the cluster's pod
    templates name (not the digests a pod restart can change) and the metadata's `key` for a
    deliberate re-run; never Flagger's checksum. With a cluster the spec's content is left out,
    so an edit of the spec file between confirm-rollout and confirm-promotion does not lose the
    revision's gate; without one the spec's content is what names the candidate."""
    overrides = json.dumps({k: md[k] for k in OVERRIDES if md.get(k)}, sort_keys=True)
    if images is not None:
        identity = [images.target, images.container, images.candidate, images.reference]
    else:
        identity = [service.spec_key(spec)]
    return service.scoped_key(
        "flagger",
        caller,
        f"{hook.namespace}/{hook.name}",
        md["spec"],
        overrides,
        *identity,
        md.get("key", ""),
    )


async def flagger_caller(request: Request, ctx: CtxDep) -> str:
    """Who asked (the token's digest, which scopes the gate's key), checked before the body is
    validated: a dependency runs before FastAPI validates the body, so a caller without a
    `run` token gets a 401 and no list of the body's mistakes (60,000 metadata keys once got
    a 7.1 MB 422 before the token was read). Flagger cannot send headers: its token may come in
    `metadata.token` (keep the Canary object as secret as the token) or, behind a proxy that
    adds it, the Authorization header."""
    token = request_token(request) or metadata_token(await request.body())

    def check() -> str:
        authorize(ctx, token, "run")
        return caller_of(ctx, request, token)

    return await run_in_threadpool(check)


def metadata_token(body: bytes) -> str | None:
    """`metadata.token` of a hook's raw body, or None whatever else the body is."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # not JSON: FastAPI answers that, after the token
        return None
    md = doc.get("metadata") if isinstance(doc, dict) else None
    token = md.get("token") if isinstance(md, dict) else None
    return token if isinstance(token, str) and 0 < len(token) <= MAX_METADATA_VALUE else None


@router.post(
    "/webhooks/flagger/{hook_type}",
    response_model=FlaggerAnswer,
    responses={
        **ERRORS,
        403: {"description": "no (not yet, or not this revision); the body says why"},
        502: {"description": "the cluster could not be read: not confirmed"},
    },
    summary="Flagger canary webhooks: confirm-rollout, confirm-promotion, rollback",
)
def flagger(
    hook_type: HookType,
    hook: FlaggerHook,
    request: Request,
    ctx: CtxDep,
    caller: Annotated[str, Depends(flagger_caller)],
) -> Any:
    """confirm-rollout starts or reads the gate of the revision the Canary's target holds and
    answers 200 only on continue (403 with the reason while it runs or on hold: Flagger keeps
    the canary in Waiting and asks again each interval). confirm-promotion answers 200 only on
    that gate's continue; rollback 200 only on its hold; neither ever starts a gate."""
    deadline = time.monotonic() + ctx.settings.flagger_budget_s  # every cluster call ends by it
    md = _flagger_metadata(hook)
    images = _rollout(ctx, hook, md, deadline)
    if images is not None and images.same_image and not any(md.get(k) for k in OVERRIDES):
        code, why = hook_answer(hook_type, None, has_gate=False, same_image=True)
        return _answer(code, None, why, ctx, images.candidate_run, images.reference_run)
    named, run_spec = _flagger_specs(ctx, md, images)
    key = _flagger_key(caller, hook, md, named, images)
    run = service.find_by_key(ctx.factory, key)
    if run is None and hook_type == "confirm-rollout":
        run = submit(ctx, run_spec, "flagger", key, owner=caller)[0]
    summary = service.verdict_summary(run, ctx.settings.public_url) if run is not None else None
    code, why = hook_answer(
        hook_type,
        summary.verdict if summary else None,
        has_gate=summary is not None,
        progressing=images is not None and hook.phase in ("Progressing", "WaitingPromotion"),
    )
    spec = parse_spec(run.spec, "stored spec") if run is not None else run_spec
    if images is not None and summary is not None and ctx.settings.flagger_annotate:
        _annotate(ctx, images, summary, deadline)
    return _answer(code, summary, why, ctx, spec.candidate.label, spec.reference.label)


def _answer(
    code: int,
    summary: VerdictSummary | None,
    why: str | None,
    ctx: CtxDep,
    candidate: str | None,
    reference: str | None,
) -> JSONResponse:
    body = FlaggerAnswer(
        id=summary.id if summary else None,
        state=summary.state if summary else None,
        verdict=summary.verdict if summary else None,
        reason=why if why is not None or summary is None else summary.reason,
        summary=summary.summary if summary else None,
        warnings=summary.warnings if summary else [],
        warnings_omitted=summary.warnings_omitted if summary else 0,
        not_shown=summary.not_shown if summary else [],
        not_shown_omitted=summary.not_shown_omitted if summary else 0,
        advisory=summary.advisory if summary else [],
        advisory_omitted=summary.advisory_omitted if summary else 0,
        report_url=summary.report_url if summary else None,
        candidate=candidate,
        reference=reference,
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=code)


def _annotate(ctx: CtxDep, images: RolloutImages, summary: VerdictSummary, deadline: float) -> None:
    """The decided verdict on the Canary, once per verdict (annotate compares first)."""
    if summary.verdict is None:
        return
    values = {
        "verdict": summary.verdict,
        "summary": summary.summary or "",
        "reason": summary.reason or "",
        "report": summary.report_url,
        "gate": summary.id,
        "candidate": images.candidate,  # the template's name: stable once pods report digests
    }
    event = ""
    if summary.verdict == "hold":
        event = (
            f"deploy gate held {images.candidate_run}: {summary.reason} "
            f"(report: {summary.report_url}); the canary waits in Waiting until the target "
            "holds a new image, the primary's image again, or the hooks' metadata.key changes"
        )
    try:
        api_client = _flagger_client(ctx)
    except ClusterError as exc:
        log.warning("could not annotate Canary %s/%s: %s", images.namespace, images.canary, exc)
        return
    try:
        annotate(api_client, images, values, event, deadline=deadline)
    finally:
        api_client.close()


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
    seen = service.find_delivery(ctx.factory, delivery_key)
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
    service.record_delivery(ctx.factory, delivery_key, "ci", digest, run.id)
    out = CiAccepted(
        delivery_id=delivery.delivery_id,
        duplicate=not created,
        gate=service.verdict_summary(run, ctx.settings.public_url),
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
    run = service.get_gate(ctx.factory, seen.gate_id) if seen.gate_id else None
    if run is None:
        raise HTTPException(410, detail="the gate of this delivery was deleted")
    out = CiAccepted(
        delivery_id=delivery.delivery_id,
        duplicate=True,
        gate=service.verdict_summary(run, ctx.settings.public_url),
    )
    return JSONResponse(out.model_dump(mode="json"), status_code=200)
