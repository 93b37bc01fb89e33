"""The FastAPI application: `/v1` (JSON API, OpenAPI at /v1/openapi.json), the report pages,
and /metrics. Built by `create_app(settings)`; `gate serve` runs it on uvicorn."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from gate.access.sessions import SessionChecker
from gate.access.tokens import TokenChecker
from gate.core.errors import MAX_PROBLEMS, GateError, SpecError, transient
from gate.core.settings import Settings
from gate.engines.orphans import sweep_orphans
from gate.http.deps import Ctx
from gate.http.guards import FiniteJson, SessionGuard
from gate.http.problems import AnswerLimit, ByteLimit, mistakes
from gate.http.problems import problem as _problem
from gate.service.dispatch import InProcessDispatcher
from gate.service.execution import open_factory
from gate.service.reaper import Reaper
from gate.worker.broker_liveness import BrokerLiveness
from gate.worker.celery_dispatch import CeleryDispatcher, make_dispatcher

log = logging.getLogger("gate.api")

DESCRIPTION = """Decides whether a candidate LLM engine image may keep rolling out.

Create a gate from a spec, poll its verdict (`continue` or `hold`, with every check's
evidence), or let a rollout controller (Argo Rollouts, Flagger) or a CI webhook do it."""


def create_app(settings: Settings | None = None, *, start_workers: bool = True) -> FastAPI:
    settings = settings or Settings()
    factory = open_factory(settings)
    ctx = Ctx(
        settings=settings,
        factory=factory,
        dispatcher=make_dispatcher(settings, factory),
        tokens=TokenChecker(factory),
        sessions=SessionChecker(factory),
    )
    app = FastAPI(
        title="LLM deploy gate",
        version="1",
        description=DESCRIPTION,
        lifespan=_lifespan(ctx, start_workers),
        # The docs page is ours (gate.api.apidocs: no CDN, under the pages' CSP); both are
        # public unless the operator hides them (GATE_API_DOCS=false).
        openapi_url="/v1/openapi.json" if settings.api_docs else None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.ctx = ctx
    _add_middleware(app, ctx)
    _add_error_handlers(app)

    from gate.api import apidocs, gates, history, integrations, ops
    from gate.web import history as history_pages
    from gate.web import pages

    if settings.api_docs:
        app.include_router(apidocs.router, prefix="/v1")
    app.include_router(gates.router, prefix="/v1")
    app.include_router(integrations.router, prefix="/v1")
    app.include_router(ops.router, prefix="/v1")
    app.include_router(history.router, prefix="/v1")
    app.include_router(ops.metrics_router)
    app.include_router(pages.router)
    app.include_router(history_pages.router)
    return app


def _lifespan(
    ctx: Ctx, start_workers: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """At start: sweep this host's orphaned engines, start the reaper, resubmit what was
    pending; at the end: stop them."""
    settings = ctx.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if start_workers:
            sweep_orphans()  # engine processes a gate killed on this host left behind
            requeue = ctx.dispatcher if isinstance(ctx.dispatcher, CeleryDispatcher) else None
            liveness = None
            if requeue is not None and settings.broker_url:
                liveness = BrokerLiveness(settings.broker_url, settings.lost_after_s)
            ctx.reaper = Reaper(settings, ctx.factory, requeue=requeue, liveness=liveness).start()
            ctx.reaper.once()
            if isinstance(ctx.dispatcher, InProcessDispatcher):
                ctx.dispatcher.resubmit_pending()
        yield
        if ctx.reaper is not None:
            ctx.reaper.stop()
        ctx.dispatcher.close()

    return lifespan


def _add_middleware(app: FastAPI, ctx: Ctx) -> None:
    # Outermost last: AnswerLimit bounds every answer, the guards' and the routes' alike;
    # BodyLimit bounds what the guards read; SessionGuard refuses a cross-site request before
    # FiniteJson parses its body.
    settings = ctx.settings
    app.add_middleware(FiniteJson)
    app.add_middleware(SessionGuard, settings=settings, sessions=ctx.sessions)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(AnswerLimit, limit=settings.max_answer_bytes)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in the documented shape, bounded (gate.http.problems)."""

    @app.exception_handler(SpecError)
    async def spec_error(_request: Request, exc: SpecError) -> JSONResponse:
        return _problem(
            422,
            exc.code,
            exc.message,
            problems=[{"path": p.path, "message": p.message} for p in exc.problems],
        )

    @app.exception_handler(GateError)
    async def gate_error(_request: Request, exc: GateError) -> JSONResponse:
        return _problem(exc.status_code, exc.code, exc.message)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # Never a plain-text 500: the documented error shape, and the cause in the log. A
        # database that is unreachable or restarting is a 503 the caller may retry.
        if transient(exc):
            log.warning("database unavailable: %s: %s", type(exc).__name__, exc)
            resp = _problem(
                503, "database_unavailable", "the gate service's database is unavailable; retry"
            )
            resp.headers["Retry-After"] = "5"
            return resp
        log.error("unhandled error: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return _problem(
            500, "internal_error", "the gate service failed on this request; see its log"
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "not_allowed"}
        resp = _problem(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))
        for k, v in (exc.headers or {}).items():
            resp.headers[k] = v
        return resp

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # 60,000 bad keys once made a 6 MB answer: the first MAX_PROBLEMS are named, the rest
        # counted (gate.http.problems), and only those are turned into text.
        errors = exc.errors()
        problems = [
            {
                "path": ".".join(str(p) for p in e["loc"] if p != "body") or "(body)",
                "message": e["msg"],
            }
            for e in errors[: MAX_PROBLEMS + 1]
        ]
        return mistakes(422, "invalid_request", "request has mistakes", problems, len(errors))


class BodyLimit(ByteLimit):
    """Refuse bodies over the limit (413) before any route reads them: by Content-Length when
    it is given, by counting the bytes as they arrive when it is not (chunked uploads)."""

    async def limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = dict(scope["headers"]).get(b"content-length")
        too_big = _problem(413, "body_too_large", f"body: larger than the {self.limit}-byte limit")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await too_big(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await too_big(scope, receive, send)


class _TooLarge(BaseException):
    pass
