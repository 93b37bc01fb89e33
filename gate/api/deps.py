"""What every route needs: the service context (settings, database, dispatcher) and the
caller's scopes. Thin: the work is in gate.runs.store, gate.access and the dispatcher."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from gate.access.tokens import TokenChecker
from gate.core.settings import Settings
from gate.runs.dispatch import Dispatcher, Reaper

TOKEN_COOKIE = "gate_token"


@dataclass
class Ctx:
    settings: Settings
    factory: sessionmaker[Session]
    dispatcher: Dispatcher
    tokens: TokenChecker
    reaper: Reaper | None = None
    finished_verdicts: dict[str, bytes] = field(default_factory=dict)  # encoded, immutable


def get_ctx(request: Request) -> Ctx:
    ctx: Ctx = request.app.state.ctx
    return ctx


async def _ctx(request: Request) -> Ctx:
    return get_ctx(request)  # async: FastAPI runs sync dependencies in a thread


CtxDep = Annotated[Ctx, Depends(_ctx)]


def request_token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.cookies.get(TOKEN_COOKIE)


def require(scope: str) -> Callable[[Request], Awaitable[frozenset[str]]]:
    """A dependency that lets the request through only with `scope` (a bearer token in the
    Authorization header, or the pages' cookie); reads may be opened by settings. Async, so a
    cached token costs no thread hop; a token not in the cache is looked up in a thread."""

    async def check(request: Request) -> frozenset[str]:
        ctx: Ctx = request.app.state.ctx
        token = request_token(request)
        if token and not (scope == "read" and ctx.settings.open_reads):
            known, _ = ctx.tokens.cached(token)
            if not known:
                await run_in_threadpool(ctx.tokens.scopes, token)  # fills the cache
        return authorize(ctx, token, scope)

    return check


def authorize(ctx: Ctx, token: str | None, scope: str) -> frozenset[str]:
    """The scopes of `token` if it has `scope`; otherwise 401 (no or unknown token) or 403."""
    if scope == "read" and ctx.settings.open_reads:
        return frozenset({"read"})
    if not token:
        raise HTTPException(
            401,
            detail=f"this needs a token with the '{scope}' scope "
            "(Authorization: Bearer gt_...; make one with `gate token create`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    scopes = ctx.tokens.scopes(token)
    if scopes is None:
        raise HTTPException(
            401, detail="unknown or revoked token", headers={"WWW-Authenticate": "Bearer"}
        )
    if scope not in scopes:
        raise HTTPException(
            403, detail=f"this token lacks the '{scope}' scope (it has {sorted(scopes)})"
        )
    return scopes


ReadDep = Annotated[frozenset[str], Depends(require("read"))]
RunDep = Annotated[frozenset[str], Depends(require("run"))]
AdminDep = Annotated[frozenset[str], Depends(require("admin"))]
