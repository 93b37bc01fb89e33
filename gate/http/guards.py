"""Rules every request meets before any route runs, as ASGI middleware (so a route added later
cannot forget them), and the app's error shape they answer in.

- SessionGuard: a browser sends its cookies with requests that other sites make it send (a
  form post, a fetch), so a state-changing request signed in by the pages' session cookie must
  prove it comes from our own pages: its `Origin` (or, absent, `Referer`) is the origin of
  GATE_PUBLIC_URL, and it carries the session's CSRF token (`X-CSRF-Token`, or the form field
  `csrf_token`). A request with a bearer header is the caller's own doing (CI, Argo, Flagger,
  curl: a browser cannot add that header cross-site) and passes untouched.
- FiniteJson: JSON has no NaN or Infinity, but Python's parser (and pydantic's) accept them,
  and a NaN compares false with everything: `abs(nan) > max_age` let a NaN timestamp through
  the CI webhook's replay window. Any body that parses as JSON with a non-finite number is
  refused (422, naming the field) before a route sees it; the answer names the first ones
  and counts the rest (gate.http.problems: it once listed every NaN of a 1 MB body, 29 MB).
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gate.access.sessions import SessionChecker
from gate.core.errors import MAX_PROBLEMS
from gate.core.settings import Settings
from gate.http.problems import mistakes, problem

__all__ = ["FiniteJson", "SessionGuard", "problem"]  # problem: its old home, re-exported

SESSION_COOKIE = "gate_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
LOGIN_PATH = "/login"  # no session yet: the login handler checks the Origin itself
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
FORM = "application/x-www-form-urlencoded"
OFF_LOOP_BYTES = 64 * 1024  # a JSON body larger than this is checked in a worker thread


async def read_body(receive: Receive) -> tuple[bytes | None, Receive]:
    """The whole body, and a `receive` that hands it to the app again. None when the client
    went away mid-body: the app then sees the disconnect, never a truncated body as whole."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, _once(message)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def _once(message: Message) -> Receive:
    async def receive() -> Message:
        return message

    return receive


# --------------------------------------------------------------------------- same origin


def origin_of(url: str) -> str | None:
    """scheme://host[:port] of a URL, lower-case, default ports dropped; None if it has none."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def same_origin(url: str, expected: str | None) -> bool:
    """`url`'s origin is `expected`; a loopback public URL (the default) also matches the other
    names of loopback on the same scheme and port, so `http://localhost:8080` signs in to a
    service configured as `http://127.0.0.1:8080`."""
    got = origin_of(url)
    if expected is None or got is None:
        return False
    if got == expected:
        return True

    g, e = urlsplit(got), urlsplit(expected)
    return (
        (g.scheme, g.port) == (e.scheme, e.port) and _loopback(g.hostname) and _loopback(e.hostname)
    )


def _loopback(host: str | None) -> bool:
    return host is not None and (host in ("localhost", "::1") or host.startswith("127."))


def origin_problem(connection: HTTPConnection, public_url: str) -> str | None:
    """None when the request says it comes from this service's pages; else what is wrong."""
    expected = origin_of(public_url)
    # The first of the two headers that is there decides.
    for header, wrong in (
        ("origin", "the Origin {} is not this service's origin {}"),
        (
            "referer",
            "there is no Origin header, and the Referer {} is not on this service's origin {}",
        ),
    ):
        said = connection.headers.get(header)
        if said is not None:
            if same_origin(said, expected):
                return None
            return wrong.format(repr(said[:200]), repr(expected)) + " (GATE_PUBLIC_URL)"
    return "neither an Origin nor a Referer header says which site sent this request"


class SessionGuard:
    """Refuse (403, naming what is missing) a state-changing request signed in by the session
    cookie that lacks our Origin or the session's CSRF token. A cookie that signs nothing in
    (unknown, expired, revoked) passes: the route then answers as to no credential at all."""

    def __init__(self, app: ASGIApp, settings: Settings, sessions: SessionChecker) -> None:
        self.app = app
        self.settings = settings  # read per request: the public URL is the settings' own
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE or scope["path"] == LOGIN_PATH:
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        secret = conn.cookies.get(SESSION_COOKIE)
        if not secret or conn.headers.get("authorization", "").lower().startswith("bearer "):
            await self.app(scope, receive, send)
            return
        known, session = self.sessions.cached(secret)
        if not known:
            session = await run_in_threadpool(self.sessions.lookup, secret)
        if session is None:
            await self.app(scope, receive, send)
            return
        problems = []
        if (wrong := origin_problem(conn, self.settings.public_url)) is not None:
            problems.append({"path": "Origin", "message": wrong})
        given = conn.headers.get(CSRF_HEADER)
        where = CSRF_HEADER
        kind = conn.headers.get("content-type", "").split(";")[0].strip().lower()
        if given is None and kind == FORM:
            body, receive = await read_body(receive)
            if body is None:
                await self.app(scope, receive, send)  # the client is gone: nothing to guard
                return
            fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=20)
            values = fields.get(CSRF_FIELD)
            given, where = (values[0] if values else None), CSRF_FIELD
        if given is None:
            problems.append(
                {
                    "path": CSRF_HEADER,
                    "message": f"missing: send the session's CSRF token in the {CSRF_HEADER} "
                    f"header (or the {CSRF_FIELD} form field)",
                }
            )
        elif not hmac.compare_digest(given.encode(), session.csrf.encode()):
            problems.append({"path": where, "message": "is not this session's CSRF token"})
        if problems:
            refused = mistakes(
                403,
                "forbidden",
                "refused: a state-changing request signed in by the session cookie must come "
                "from this service's pages",
                problems,
            )
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------- finite JSON


class _NonFinite:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def nonfinite_paths(body: bytes) -> list[tuple[str, str]] | None:
    """(path, literal) of every NaN, Infinity, -Infinity or overflowing number in a JSON
    body, sorted, paths dotted as the validation errors' (`spec.scenarios.0.rate`); None when
    the body is not JSON at all (the route decides what to make of it)."""
    found = nonfinite_first(body, limit=None)
    return None if found is None else sorted(found[0])


def nonfinite_first(
    body: bytes, limit: int | None = MAX_PROBLEMS + 1
) -> tuple[list[tuple[str, str]], int] | None:
    """The first `limit` non-finite numbers of a JSON body in document order (path, literal),
    and how many it has; None when it is not JSON. The parser counts them, the walk stops at
    `limit`: 200,000 NaN cost the parse alone, never 200,000 paths."""
    count = 0

    def mark(text: str) -> _NonFinite:
        nonlocal count
        count += 1
        return _NonFinite(text)

    def number(text: str) -> float | _NonFinite:
        value = _float(text)
        return mark(text) if isinstance(value, _NonFinite) else value

    try:
        doc = json.loads(body, parse_constant=mark, parse_float=number)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return None
    found: list[tuple[str, str]] = []
    # a stack of iterators, not of items: a list of 200,000 values is never copied
    stack: list[tuple[str, Iterator[tuple[Any, Any]]]] = [("", iter([("", doc)]))] if count else []
    while stack and (limit is None or len(found) < limit):  # no recursion: a deep body
        prefix, items = stack[-1]  # must not exhaust the stack here
        step = next(items, None)
        if step is None:
            stack.pop()
            continue
        key, value = step
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, _NonFinite):
            found.append((path or "(body)", value.text))
        elif isinstance(value, dict):
            stack.append((path, iter(value.items())))
        elif isinstance(value, list):
            stack.append((path, enumerate(value)))
    return found, count


class FiniteJson:
    """Refuse (422) any request body that is JSON with a non-finite number in it, whatever
    its content type says (a route may parse the raw body itself, as the CI webhook does).
    Form posts are not JSON and pass untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE:
            await self.app(scope, receive, send)
            return
        kind = HTTPConnection(scope).headers.get("content-type", "").split(";")[0].strip()
        if kind.lower() in (FORM, "multipart/form-data"):
            await self.app(scope, receive, send)
            return
        body, receive = await read_body(receive)
        found = None
        if body and len(body) > OFF_LOOP_BYTES:  # the parse of 1 MB takes ~0.3 s: not on the
            found = await run_in_threadpool(nonfinite_first, body)  # loop honest requests use
        elif body:
            found = nonfinite_first(body)
        if found is not None and found[1]:
            first, count = found
            problems = [
                {
                    "path": path,
                    "message": f"{text} is not a number JSON allows: give a finite number",
                }
                for path, text in first
            ]
            refused = mistakes(422, "invalid_request", "request has mistakes", problems, count)
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)
