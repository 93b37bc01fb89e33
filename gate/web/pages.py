"""Report pages served by `gate serve`: `/` lists gates (filter by state, verdict and
candidate, paged), `/gates/{id}` is one gate: the same report as the file `gate run` writes
(one renderer, gate.reports.html), or, while the gate runs, its live progress.

Pages need read access like the JSON API (a bearer header or the sign-in session's cookie,
or nobody when reads are open); without it they redirect to `/login`, which checks a token and
makes a server-side session (gate.access.sessions: read only, unless the form asks for running
and cancelling gates and the token may). The cookie (`gate_session`: HttpOnly, SameSite=Strict,
Secure when the public URL is https) carries only the session's secret, never the token. The
login post must come from our own origin; every other form post carries the session's CSRF
token (`csrf_token`, also the value a script sends as `X-CSRF-Token`), checked with the Origin
by gate.http.guards. Every response carries a Content-Security-Policy whose only script is the
live page's inline poller, allowed by a per-response nonce.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool

from gate.access.sessions import BrowserSession
from gate.core.errors import DocumentUnreadable, GateNotFound
from gate.core.vocabulary import FINISHED, STATES, VERDICTS
from gate.http.deps import Ctx, authorize, get_ctx, request_token
from gate.http.guards import CSRF_FIELD, SESSION_COOKIE, origin_problem
from gate.reports.formats import format_time
from gate.reports.html import environment, render_body
from gate.service import service
from gate.service.schemas import GateFilter
from gate.verdict.document import VerdictDocument
from gate.verdict.summary import stored_summary

if TYPE_CHECKING:  # the service's rows, for annotations only
    from gate.models import GateRun

router = APIRouter(include_in_schema=False)

PER_PAGE = 25
LEGACY_COOKIE = "gate_token"  # the raw token the pages once kept in the browser: cleared
CSP = (
    "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
_LOADER = PackageLoader("gate.web", "templates")


def _env() -> Environment:
    return environment(_LOADER)


# --------------------------------------------------------------------------- plumbing


def _session(request: Request) -> BrowserSession | None:
    secret = request.cookies.get(SESSION_COOKIE)
    return get_ctx(request).sessions.lookup(secret) if secret else None


def _page(
    request: Request,
    template: str,
    status: int = 200,
    *,
    look_up_session: bool = True,  # False from async handlers: the lookup may block
    session: BrowserSession | None = None,  # the one this response signs in
    **ctx: Any,
) -> HTMLResponse:
    nonce = secrets.token_urlsafe(18)
    if session is None and look_up_session:
        session = _session(request)
    html = (
        _env()
        .get_template(template)
        .render(
            nonce=nonce,
            signed_in=session is not None,
            api_docs=get_ctx(request).settings.api_docs,  # GATE_API_DOCS=false: no link to a 404
            csrf_field=CSRF_FIELD,
            csrf=session.csrf if session is not None else "",
            **ctx,
        )
    )
    resp = HTMLResponse(html, status_code=status)
    resp.headers["Content-Security-Policy"] = CSP.format(nonce=nonce)
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    resp.headers["Cache-Control"] = "no-store"
    return resp


def _here(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path on this site, never another origin."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value


def _denied(request: Request) -> Response | None:
    """None when the caller may read; else the redirect to the login form (no or a bad
    token) or an error page (a token without the read scope)."""
    try:
        authorize(get_ctx(request), request_token(request), "read")
    except HTTPException as exc:
        if exc.status_code == 401:
            return RedirectResponse(
                "/login?" + urlencode({"next": _here(request)}), status_code=303
            )
        return _page(
            request, "error.html.j2", exc.status_code, title="No access", message=str(exc.detail)
        )
    return None


def _not_found(request: Request, gate_id: str) -> HTMLResponse:
    return _page(
        request, "error.html.j2", 404, title="No such gate", message=f"no gate with id {gate_id!r}"
    )


# --------------------------------------------------------------------------- list


def _choice(value: str, allowed: tuple[str, ...]) -> str:
    return value if value in allowed else ""


@router.get("/", response_class=HTMLResponse)
def gates_page(
    request: Request, state: str = "", verdict: str = "", candidate: str = "", page: str = "1"
) -> Response:
    if (denied := _denied(request)) is not None:
        return denied
    ctx = get_ctx(request)
    state, verdict = _choice(state, STATES), _choice(verdict, VERDICTS)
    candidate = candidate.strip()[:200]
    number = int(page) if page.isdigit() and 0 < int(page) < 1_000_000 else 1
    rows, total = service.list_gates(
        ctx.factory,
        GateFilter(
            state=state or None,
            verdict=verdict or None,
            candidate=candidate or None,
            limit=PER_PAGE,
            offset=(number - 1) * PER_PAGE,
        ),
    )
    filters = {
        k: v for k, v in (("state", state), ("verdict", verdict), ("candidate", candidate)) if v
    }

    def page_url(n: int) -> str:
        return "/?" + urlencode({**filters, "page": n}) if n > 1 else "/?" + urlencode(filters)

    last = max(1, -(-total // PER_PAGE))
    return _page(
        request,
        "gates.html.j2",
        title="Gates",
        gates=[_row(r) for r in rows],
        total=total,
        first_shown=(number - 1) * PER_PAGE + 1 if rows else 0,
        last_shown=(number - 1) * PER_PAGE + len(rows),
        newer=page_url(number - 1) if number > 1 else None,
        older=page_url(number + 1) if number < last else None,
        state=state,
        verdict=verdict,
        candidate=candidate,
        states=STATES,
        verdicts=VERDICTS,
        filtered=bool(filters),
    )


def _took(run: GateRun) -> str:
    if run.started_at is None or run.finished_at is None:
        return ""
    s = (run.finished_at - run.started_at).total_seconds()
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def _row(run: GateRun) -> dict[str, Any]:
    finished = run.state in FINISHED
    said = stored_summary(run.verdict, run.document, run.reason) if finished else None
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "phase": run.phase,
        "verdict": run.verdict if finished else None,
        # the verdict word as every surface says it, and the line when it says more
        "banner": said.banner if said else None,
        "summary": said.line() if said and said.line() != run.verdict else "",
        "progress": progress_view(run.state, run.phase, run.progress)["text"]
        if run.state not in FINISHED
        else "",
        "reference": run.reference_label or "",
        "candidate": run.candidate_label or "",
        "source": run.source,
        "created": format_time(run.created_at),
        "took": _took(run),
    }


# --------------------------------------------------------------------------- one gate


def progress_view(state: str, phase: str, progress: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the live part shows; live.js computes the same from `GET /v1/gates/{id}`."""
    pct: int | None = None
    if isinstance(progress, Mapping) and progress.get("scenario") is not None:
        done, total = progress.get("done") or 0, progress.get("total") or 0
        if isinstance(total, int) and total > 0 and isinstance(done, int):
            pct = max(0, min(100, round(100 * done / total)))
            text = f"scenario {progress['scenario']}: {done} of {total} responses ({pct}%)"
        else:
            text = f"scenario {progress['scenario']}: {done} responses"
    elif state == "pending":
        text = "waiting for a worker"
    else:
        text = f"phase {phase}"
    return {"pct": pct, "text": text}


def gate_links(gate_id: str) -> list[tuple[str, str]]:
    return [
        ("gate (JSON)", f"/v1/gates/{gate_id}"),
        ("verdict (JSON)", f"/v1/gates/{gate_id}/verdict"),
        ("verdict document (JSON)", f"/v1/gates/{gate_id}/document"),
    ]


def _warmup(run: GateRun) -> int:
    policy = (run.spec or {}).get("policy") or {}
    value = policy.get("warmup_requests", 8) if isinstance(policy, Mapping) else 8
    return value if isinstance(value, int) and value >= 0 else 8


class _BodyCache:
    """Rendered reports of finished gates, a few at a time (charts from every request are
    the expensive part of a page, and a finished gate's document and samples stay put)."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], Markup] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> Markup | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: tuple[str, str], body: Markup) -> None:
        with self._lock:
            self._items[key] = body
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_bodies = _BodyCache()


def _report_body(ctx: Ctx, run: GateRun) -> Markup:
    assert run.document is not None
    digest = hashlib.sha256(
        json.dumps(run.document, sort_keys=True, default=str).encode()
    ).hexdigest()
    key = (run.id, digest)  # a document written again (a re-run, a re-judge) renders anew
    body = _bodies.get(key)
    if body is None:
        body = render_body(
            VerdictDocument.read(run.document),
            service.sample_columns(ctx.factory, run.id),
            _warmup(run),
            gate_links(run.id),
        )
        _bodies.put(key, body)
    return body


@router.get("/gates/{gate_id}", response_class=HTMLResponse)
def gate_page(request: Request, gate_id: str) -> Response:
    if (denied := _denied(request)) is not None:
        return denied
    ctx = get_ctx(request)
    try:
        run = service.get_gate(ctx.factory, gate_id)
    except GateNotFound:
        return _not_found(request, gate_id)
    finished = run.state in FINISHED
    if finished and run.document is not None:
        verdict = str(run.document.get("verdict") or run.verdict or "hold")
        banner = stored_summary(verdict, run.document, run.reason).banner
        try:
            body = _report_body(ctx, run)
        except DocumentUnreadable as exc:
            return _page(request, "error.html.j2", 500, title="Unreadable", message=exc.message)
        return _page(request, "gate.html.j2", title=f"{banner} · {run.name}", body=body)
    phases = service.all_phases(ctx.factory, gate_id)
    return _page(
        request,
        "gate_live.html.j2",
        title=f"{run.state} · {run.name}",
        run=run,
        finished=finished,
        created=format_time(run.created_at),
        started=format_time(run.started_at) if run.started_at else None,
        progress=progress_view(run.state, run.phase, run.progress),
        phases=phases,
        links=gate_links(run.id),
    )


# --------------------------------------------------------------------------- login


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/") -> Response:  # the query's name
    return _page(request, "login.html.j2", title="Sign in", next=safe_next(next), error=None)


def _login_page(request: Request, status: int, target: str, error: str) -> HTMLResponse:
    return _page(
        request,
        "login.html.j2",
        status,
        look_up_session=False,
        title="Sign in",
        next=target,
        error=error,
    )


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """A form post (application/x-www-form-urlencoded, parsed here: no multipart needed). It
    has no session to carry a CSRF token yet, so it must come from our own origin: another
    site must not sign a browser in (to its own token, say) behind the user's back."""
    ctx = get_ctx(request)
    if (wrong := origin_problem(request, ctx.settings.public_url)) is not None:
        return _login_page(request, 403, "/", f"Sign-in refused: {wrong}.")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return _login_page(request, 415, "/", "send the form as application/x-www-form-urlencoded")
    body = (await request.body()).decode("utf-8", "replace")
    fields = parse_qs(body, keep_blank_values=True, max_num_fields=10)
    token = (fields.get("token") or [""])[0].strip()
    target = safe_next((fields.get("next") or ["/"])[0])
    allow_run = (fields.get("allow_run") or [""])[0] in ("1", "on", "true", "yes")
    max_age = ctx.settings.session_max_age_s
    made = (
        await run_in_threadpool(ctx.sessions.create, token, allow_run=allow_run, max_age_s=max_age)
        if token
        else None
    )
    if made is None:
        error = "That token is unknown or revoked." if token else "Enter a token."
        return _login_page(request, 401, target, error)
    if (old := request.cookies.get(SESSION_COOKIE)) is not None:
        await run_in_threadpool(ctx.sessions.revoke, old)  # a new sign-in replaces the old
    resp: Response
    if allow_run and "run" not in made.session.scopes:
        # Asked to run gates with a token that may only read: signed in, and told so, rather
        # than sent on to find out at the first cancel button that does nothing.
        resp = _page(
            request,
            "signed_in.html.j2",
            look_up_session=False,
            session=made.session,
            title="Signed in, read only",
            next=target,
        )
    else:
        resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(
        SESSION_COOKIE,
        made.secret,
        max_age=math.ceil(max_age),
        path="/",
        httponly=True,
        samesite="strict",
        # Behind a TLS-terminating proxy the request is http; the public URL says https.
        secure=request.url.scheme == "https" or ctx.settings.public_url.startswith("https://"),
    )
    if LEGACY_COOKIE in request.cookies:
        resp.delete_cookie(LEGACY_COOKIE, path="/", httponly=True, samesite="strict")
    return resp


@router.post("/logout")
def logout(request: Request) -> Response:
    """Ends the session on the server, not only in this browser (a copied cookie dies too).
    The CSRF token and Origin were checked before this runs (gate.http.guards)."""
    if (secret := request.cookies.get(SESSION_COOKIE)) is not None:
        get_ctx(request).sessions.revoke(secret)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    if LEGACY_COOKIE in request.cookies:
        resp.delete_cookie(LEGACY_COOKIE, path="/", httponly=True, samesite="strict")
    return resp
