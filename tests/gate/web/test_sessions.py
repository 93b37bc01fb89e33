"""Sign-in sessions and cross-site requests, through the real app: the cookie is a session of
its own (never the token), read only unless asked, ended by signing out or by revoking its
token; a state-changing request signed in by the cookie needs our Origin and the session's
CSRF token, a bearer request does not."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from apitools import SIM_TEMPLATE, Recording, auth, spec_dict, wait_for
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gate.access import sessions
from gate.access.tokens import SCOPES, create_token, digest, revoke
from gate.api.app import create_app
from gate.core.database import transaction
from gate.core.settings import Settings
from gate.http.guards import origin_of
from gate.models import GateRun, WebSession

PUBLIC = "http://gate.test"
OURS = {"Origin": PUBLIC}
EVIL = "https://evil.example"


@dataclass
class Site:
    client: TestClient
    factory: sessionmaker[Session]
    tokens: dict[str, str]
    dispatcher: Recording
    seed: Any


@pytest.fixture
def site(tmp_path: Path, wt: Any) -> Iterator[Site]:
    settings = Settings(
        data_dir=tmp_path / ".gate",
        public_url=PUBLIC,
        open_reads=False,
        lost_after_s=3600,
        engines={"sim": SIM_TEMPLATE},
    )
    app = create_app(settings, start_workers=False)
    recording = Recording()  # gates are stored, none is run
    app.state.ctx.dispatcher = recording
    factory = app.state.ctx.factory
    tokens = {s: create_token(factory, f"web-{s}", [s]) for s in SCOPES}
    with TestClient(app, base_url=PUBLIC) as client:
        yield Site(client, factory, tokens, recording, wt.Seed(factory))


def sign_in(site: Site, scope: str, *, allow_run: bool = False) -> str:
    """Sign in as a browser on our pages does; the session's CSRF token, from the page."""
    form = {"token": site.tokens[scope], "next": "/"}
    if allow_run:
        form["allow_run"] = "1"
    r = site.client.post("/login", data=form, headers=OURS, follow_redirects=False)
    told = allow_run and scope == "read"  # signed in, and told it may only read
    assert r.status_code == (200 if told else 303), r.text
    page = site.client.get("/")
    assert page.status_code == 200 and "Sign out" in page.text
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None, "the sign-out form carries the session's CSRF token"
    return found.group(1)


def gate_count(site: Site) -> int:
    with transaction(site.factory) as s:
        return int(s.scalar(select(func.count()).select_from(GateRun)) or 0)


def gate_row(site: Site, gate_id: str) -> tuple[str, bool]:
    with transaction(site.factory) as s:
        run = s.get(GateRun, gate_id)
        assert run is not None
        return run.state, run.cancel_requested


def session_rows(site: Site) -> list[WebSession]:
    with transaction(site.factory) as s:
        return list(s.scalars(select(WebSession).order_by(WebSession.id)).all())


def new_gate_body(site: Site) -> dict[str, Any]:
    return {"spec": spec_dict("csrf-probe")}


def test_session_cookie_is_not_the_token(site: Site) -> None:
    token = site.tokens["read"]
    r = site.client.post(
        "/login", data={"token": token, "next": "/"}, headers=OURS, follow_redirects=False
    )
    assert r.status_code == 303
    cookies = r.headers.get_list("set-cookie")
    assert len(cookies) == 1 and token not in cookies[0]
    secret = site.client.cookies["gate_session"]
    assert secret.startswith("gs_") and secret != token
    attrs = [a.strip().lower() for a in cookies[0].split(";")]
    assert {"httponly", "path=/", "samesite=strict"} <= set(attrs), attrs
    assert "secure" not in attrs  # the public URL is http
    # The database keeps only the secret's SHA-256, never the secret or the token.
    (row,) = session_rows(site)
    assert row.secret_hash == digest(secret) and secret not in (row.csrf_token, row.secret_hash)
    assert row.scopes == "read"
    assert abs((row.expires_at - row.created_at).total_seconds() - 12 * 3600) < 5
    assert site.client.get("/v1/gates").status_code == 200  # the session reads the API too

    # A token put in the cookie (as the pages once did) signs nothing in.
    for name in ("gate_session", "gate_token"):
        site.client.cookies.clear()
        site.client.cookies.set(name, token)
        assert site.client.get("/v1/gates").status_code == 401, name
        assert site.client.get("/", follow_redirects=False).status_code == 303, name
    # Nor does a session secret sent as a bearer token.
    site.client.cookies.clear()
    assert site.client.get("/v1/gates", headers=auth(secret)).status_code == 401


def test_a_read_token_asking_to_run_is_told_it_cannot(site: Site) -> None:
    """Issue 30: a read-only sign-in with "allow running" ticked said nothing, and the browser
    found out at its first cancel. It is signed in (read), and the page says why not run."""
    form = {"token": site.tokens["read"], "next": "/gates/abc?x=1", "allow_run": "1"}
    r = site.client.post("/login", data=form, headers=OURS, follow_redirects=False)
    assert r.status_code == 200 and "gate_session" in r.headers["set-cookie"]
    assert "cannot run gates" in r.text and "<code>run</code> scope" in r.text
    assert 'href="/gates/abc?x=1"' in r.text  # on to where it was going
    assert "Sign out" in r.text  # the header knows it is signed in
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    assert session_rows(site)[-1].scopes == "read"
    assert site.client.get("/v1/gates").status_code == 200  # reads work

    for scope in ("run", "admin"):  # a token that may run: straight on, nothing to say
        form = {"token": site.tokens[scope], "next": "/", "allow_run": "1"}
        r = site.client.post("/login", data=form, headers=OURS, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/", scope
    form = {"token": site.tokens["read"], "next": "/"}  # not asked: nothing to say either
    r = site.client.post("/login", data=form, headers=OURS, follow_redirects=False)
    assert r.status_code == 303


def test_session_is_read_only_unless_asked(site: Site) -> None:
    pending = site.seed.live(state="pending", phase="queued")
    csrf = sign_in(site, "run")  # a run token, but the box was not ticked
    r = site.client.post(f"/v1/gates/{pending}:cancel", headers={**OURS, "X-CSRF-Token": csrf})
    assert r.status_code == 403
    assert "lacks the 'run' scope" in r.json()["error"]["message"]
    assert gate_row(site, pending) == ("pending", False)

    csrf = sign_in(site, "read", allow_run=True)  # asked, but the token may only read
    r = site.client.post(f"/v1/gates/{pending}:cancel", headers={**OURS, "X-CSRF-Token": csrf})
    assert r.status_code == 403 and gate_row(site, pending) == ("pending", False)

    csrf = sign_in(site, "admin", allow_run=True)  # asked, and the token may: run, never admin
    assert session_rows(site)[-1].scopes == "read,run"
    # run, not admin: the session may cancel only its token's gates (issue 14)
    r = site.client.post(f"/v1/gates/{pending}:cancel", headers={**OURS, "X-CSRF-Token": csrf})
    assert r.status_code == 403 and "another token" in r.text
    owner = f"token:{session_rows(site)[-1].token_id}"
    with transaction(site.factory) as s:
        row = s.get(GateRun, pending)
        assert row is not None
        row.owner = owner
    r = site.client.post(f"/v1/gates/{pending}:cancel", headers={**OURS, "X-CSRF-Token": csrf})
    assert r.status_code == 202, r.text
    assert gate_row(site, pending)[0] == "cancelled"
    # Each sign-in replaced the one before it: only the last is live.
    assert [row.revoked_at is None for row in session_rows(site)] == [False, False, True]


def test_revoked_token_ends_its_sessions(site: Site) -> None:
    sign_in(site, "read")
    assert site.client.get("/v1/gates").status_code == 200
    assert revoke(site.factory, "web-read") == 1
    t0 = time.monotonic()
    wait_for(
        lambda: site.client.get("/v1/gates").status_code == 401,
        timeout=sessions.CACHE_S + 3,
        every=0.1,
        what="the revoked token's session to end",
    )
    assert time.monotonic() - t0 <= sessions.CACHE_S + 1
    r = site.client.get("/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")


def test_logout_revokes(site: Site) -> None:
    csrf = sign_in(site, "read")
    secret = site.client.cookies["gate_session"]
    # Signing out is itself a state-changing post: without the CSRF token it is refused.
    r = site.client.post("/logout", headers=OURS, follow_redirects=False)
    assert r.status_code == 403 and "csrf_token" in r.json()["error"]["message"]
    assert session_rows(site)[0].revoked_at is None
    out = site.client.post(
        "/logout", data={"csrf_token": csrf}, headers=OURS, follow_redirects=False
    )
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert 'gate_session=""' in out.headers["set-cookie"]
    assert session_rows(site)[0].revoked_at is not None
    # A copy of the cookie (another tab, a stolen one) is dead too, at once.
    site.client.cookies.clear()
    site.client.cookies.set("gate_session", secret)
    assert site.client.get("/v1/gates").status_code == 401
    assert site.client.get("/", follow_redirects=False).status_code == 303
    assert "Sign out" not in site.client.get("/login").text


def test_cross_site_post_with_cookie_is_refused(site: Site) -> None:
    pending = site.seed.live(state="pending", phase="queued")
    csrf = sign_in(site, "run", allow_run=True)
    before = gate_count(site)
    body = new_gate_body(site)
    attacks: list[tuple[dict[str, str], list[str]]] = [
        ({"Origin": EVIL}, ["Origin", "X-CSRF-Token"]),  # a plain cross-site fetch or form
        (OURS, ["X-CSRF-Token"]),  # no CSRF token
        ({"Origin": PUBLIC, "X-CSRF-Token": "guessed"}, ["X-CSRF-Token"]),  # a wrong one
        ({"Origin": EVIL, "X-CSRF-Token": csrf}, ["Origin"]),  # wrong Origin
        ({"Origin": "null", "X-CSRF-Token": csrf}, ["Origin"]),  # a sandboxed frame
        ({"X-CSRF-Token": csrf}, ["Origin"]),  # no Origin, no Referer
        ({"Referer": f"{EVIL}/page", "X-CSRF-Token": csrf}, ["Origin"]),  # foreign Referer
        ({"Origin": "http://gate.test.evil.example", "X-CSRF-Token": csrf}, ["Origin"]),
    ]
    for headers, missing in attacks:
        for method, path, kwargs in (
            ("POST", "/v1/gates", {"json": body}),
            ("POST", "/v1/gates:ensure", {"json": body}),
            ("POST", f"/v1/gates/{pending}:cancel", {}),
        ):
            r = site.client.request(method, path, headers=headers, **kwargs)
            assert r.status_code == 403, (headers, path, r.text)
            error = r.json()["error"]
            assert [p["path"] for p in error["problems"]] == missing, (headers, error)
            for name in missing:
                assert name in error["message"]
    # A cross-site HTML form (no Origin check can be skipped by sending a form instead).
    r = site.client.post(
        f"/v1/gates/{pending}:cancel",
        data={"csrf_token": "guessed"},
        headers={"Origin": EVIL},
    )
    assert r.status_code == 403
    # Nothing was created, nothing was cancelled, nothing was handed to a worker.
    assert gate_count(site) == before
    assert gate_row(site, pending) == ("pending", False)
    assert site.dispatcher.submitted == []

    # The same requests from our own pages, with the session's token, go through.
    ours = {**OURS, "X-CSRF-Token": csrf}
    created = site.client.post("/v1/gates", json=body, headers=ours)
    assert created.status_code == 202, created.text
    assert gate_count(site) == before + 1 and len(site.dispatcher.submitted) == 1
    mine = created.json()["id"]  # the session's token owns it, so may cancel it
    referer = {"Referer": f"{PUBLIC}/gates/{mine}", "X-CSRF-Token": csrf}  # Origin absent
    assert site.client.post(f"/v1/gates/{mine}:cancel", headers=referer).status_code == 202
    assert gate_row(site, mine)[0] == "cancelled"


def test_bearer_requests_need_no_csrf(site: Site) -> None:
    """CI, Argo, Flagger and curl send a bearer header: no Origin, no CSRF token, and a
    browser cannot add that header to a cross-site request."""
    sign_in(site, "read")  # a cookie in the jar changes nothing for a bearer request
    created = site.client.post(
        "/v1/gates", json=new_gate_body(site), headers=auth(site.tokens["run"])
    )
    assert created.status_code == 202, created.text
    mine = created.json()["id"]
    r = site.client.post(f"/v1/gates/{mine}:cancel", headers=auth(site.tokens["run"]))
    assert r.status_code == 202, r.text


def test_cross_site_login_is_refused(site: Site) -> None:
    """Another site must not sign a browser in behind its user's back (login CSRF)."""
    for headers in ({"Origin": EVIL}, {"Referer": f"{EVIL}/x"}, {}):
        r = site.client.post(
            "/login",
            data={"token": site.tokens["run"], "next": "/", "allow_run": "1"},
            headers=headers,
            follow_redirects=False,
        )
        assert r.status_code == 403, headers
        assert "set-cookie" not in r.headers and "Sign-in refused" in r.text
    assert session_rows(site) == []


def test_expired_session_is_signed_out(site: Site) -> None:
    site.client.app.state.ctx.settings.session_max_age_s = 1.0  # type: ignore[attr-defined]
    sign_in(site, "read")
    secret = site.client.cookies["gate_session"]
    time.sleep(1.2)
    site.client.cookies.clear()
    site.client.cookies.set("gate_session", secret)  # a browser that kept it past its age
    assert site.client.get("/v1/gates").status_code == 401
    assert site.client.get("/", follow_redirects=False).status_code == 303


@pytest.mark.parametrize(
    ("origin", "same"),
    [
        ("http://gate.test", True),
        ("HTTP://Gate.Test:80", True),
        ("http://gate.test:8080", False),
        ("https://gate.test", False),
        ("http://sub.gate.test", False),
        ("http://gate.test.evil.example", False),
        ("null", False),
        ("", False),
    ],
)
def test_origin_must_be_the_public_urls(origin: str, same: bool) -> None:
    assert (origin_of(origin) == origin_of(PUBLIC)) is same
    assert origin_of("https://[::1]:443/x") == "https://[::1]"
    assert origin_of("http://h:99999") is None


@pytest.mark.parametrize(
    ("origin", "same"),
    [
        ("http://localhost:8080", True),
        ("http://[::1]:8080", True),
        ("http://127.0.0.2:8080", True),
        ("http://localhost:8081", False),  # another port is another service
        ("https://localhost:8080", False),
        ("http://gate.example:8080", False),
    ],
)
def test_a_loopback_public_url_accepts_loopbacks_other_names(origin: str, same: bool) -> None:
    """The default public URL (http://127.0.0.1:8080) is also reached as localhost; only the
    names of loopback are equivalent, and only on the same scheme and port."""
    from gate.http.guards import same_origin

    assert same_origin(origin, origin_of("http://127.0.0.1:8080")) is same
    assert not same_origin(origin, origin_of("https://gate.acme.example"))
