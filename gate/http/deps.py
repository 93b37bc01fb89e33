"""What every route needs: the service context (settings, database, dispatcher) and the
caller's scopes. Thin: the work is in gate.service, gate.access and the dispatcher.

A caller is signed in by a bearer token (Authorization header: CI, controllers, curl) or by
the pages' session cookie (gate.access.sessions: the session's scopes, never the token's).
A state-changing request signed in by the cookie has already passed gate.http.guards'
SessionGuard (our Origin, the session's CSRF token) before any route runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from gate.access.sessions import SessionChecker
from gate.access.tokens import TokenChecker
from gate.core.settings import Settings
from gate.http.guards import SESSION_COOKIE
from gate.service.dispatch import Dispatcher
from gate.service.reaper import Reaper


@dataclass
class Ctx:
    settings: Settings
    factory: sessionmaker[Session]
    dispatcher: Dispatcher
    tokens: TokenChecker
    sessions: SessionChecker
    reaper: Reaper | None = None
    finished_verdicts: dict[str, bytes] = field(default_factory=dict)  # encoded, immutable


def get_ctx(request: Request) -> Ctx:
    ctx: Ctx = request.app.state.ctx
    return ctx


async def _ctx(request: Request) -> Ctx:
    return get_ctx(request)  # async: FastAPI runs sync dependencies in a thread


CtxDep = Annotated[Ctx, Depends(_ctx)]


class SessionSecret(str):
    """The pages' cookie value: a sign-in session's secret, never an API token. Its own type,
    so that `authorize` looks it up as a session, and a token put in the cookie (as the pages
    once did) is never taken as a token."""

    __slots__ = ()


def request_token(request: Request) -> str | None:
    """The bearer token of the Authorization header, else the session cookie's secret (a
    SessionSecret), else None."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    cookie = request.cookies.get(SESSION_COOKIE)
    return SessionSecret(cookie) if cookie else None


def require(scope: str) -> Callable[[Request], Awaitable[frozenset[str]]]:
    """A dependency that lets the request through only with `scope` (a bearer token in the
    Authorization header, or the pages' session cookie); reads may be opened by settings.
    Async, so a cached token or session costs no thread hop; one not in the cache is looked up
    in a thread."""

    async def check(request: Request) -> frozenset[str]:
        ctx: Ctx = request.app.state.ctx
        token = request_token(request)
        if token and not (scope == "read" and ctx.settings.open_reads):
            if isinstance(token, SessionSecret):
                if not ctx.sessions.cached(token)[0]:
                    await run_in_threadpool(ctx.sessions.lookup, token)  # fills the cache
            elif not ctx.tokens.cached(token)[0]:
                await run_in_threadpool(ctx.tokens.scopes, token)  # fills the cache
        return authorize(ctx, token, scope)

    return check


def authorize(ctx: Ctx, token: str | None, scope: str) -> frozenset[str]:
    """The scopes of `token` (an API token, or a SessionSecret: its session's scopes) if they
    include `scope`; otherwise 401 (no, unknown, revoked or expired credential) or 403."""
    if scope == "read" and ctx.settings.open_reads:
        return frozenset({"read"})
    if not token:
        raise HTTPException(
            401,
            detail=f"this needs a token with the '{scope}' scope "
            "(Authorization: Bearer gt_...; make one with `gate token create`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if isinstance(token, SessionSecret):
        return _session_scopes(ctx, token, scope)
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


def _session_scopes(ctx: Ctx, secret: SessionSecret, scope: str) -> frozenset[str]:
    session = ctx.sessions.lookup(secret)
    if session is None:
        raise HTTPException(
            401,
            detail="signed out: the sign-in expired or ended, or its token was revoked; "
            "sign in again at /login (or send Authorization: Bearer gt_...)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if scope not in session.scopes:
        if scope == "run":
            how = (
                "sign in again with 'allow running and cancelling gates from this browser' "
                "and a token that has the 'run' scope"
            )
        else:
            how = "a browser session never has it: send the token as Authorization: Bearer"
        raise HTTPException(
            403,
            detail=f"this browser session lacks the '{scope}' scope "
            f"(it has {sorted(session.scopes)}): {how}",
        )
    return session.scopes


ReadDep = Annotated[frozenset[str], Depends(require("read"))]
RunDep = Annotated[frozenset[str], Depends(require("run"))]
AdminDep = Annotated[frozenset[str], Depends(require("admin"))]
