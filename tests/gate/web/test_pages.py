"""The report pages over HTTP (no browser): what they show, the one renderer they share with
the file report, escaping, the CSP, and sign-in without an open redirect."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings
from gate.reports.html import render_body, write_report
from gate.verdict import VerdictDocument
from gate.web.pages import progress_view, safe_next


@pytest.fixture
def client(web_app: FastAPI) -> Iterator[TestClient]:
    with TestClient(web_app) as c:
        yield c


def _nonce(resp_csp: str) -> str:
    m = re.search(r"script-src 'nonce-([A-Za-z0-9_-]+)'", resp_csp)
    assert m, resp_csp
    return m.group(1)


def test_gate_page_is_the_file_report_with_links(
    client: TestClient, seed: Any, wt: Any, tmp_path: Path
) -> None:
    gid = seed.finished(columns=wt.evil_columns())
    r = client.get(f"/gates/{gid}")
    assert r.status_code == 200
    html = r.text
    # One renderer: the served page embeds exactly the body the file report has.
    doc = client.app.state.ctx.factory  # type: ignore[attr-defined]
    from gate.service.service import get_gate

    run = get_gate(doc, gid)
    assert run.document is not None
    body = render_body(
        VerdictDocument.read(run.document),
        wt.evil_columns(),
        4,
        [
            ("gate (JSON)", f"/v1/gates/{gid}"),
            ("verdict (JSON)", f"/v1/gates/{gid}/verdict"),
            ("verdict document (JSON)", f"/v1/gates/{gid}/document"),
        ],
    )
    assert str(body) in html
    out = tmp_path / "r.html"
    write_report(VerdictDocument.read(run.document), wt.evil_columns(), out, warmup=4)
    file_html = out.read_text()
    # The file links the JSON written beside it; the page links the API's documents.
    assert 'href="r.json"' in file_html and 'href="r.json"' not in html
    for href in (f"/v1/gates/{gid}", f"/v1/gates/{gid}/verdict", f"/v1/gates/{gid}/document"):
        assert f'href="{href}"' in html
    # Charts: two CDFs, two over-time, throughput, errors per scenario, and the lifecycle.
    kinds = re.findall(r'data-chart="([a-z-]+)"', html)
    assert sorted(kinds) == sorted(
        ["cdf", "cdf", "over-time", "over-time", "throughput", "errors", "lifecycle"]
    )
    assert 'aria-label="steady: time to first token (CDF).' in html
    assert "Correctness and divergence examples" in html and 'class="tok div"' in html
    # A finished gate's page runs no script at all; the CSP would refuse any injected one.
    assert "<script" not in html
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "connect-src 'self'" in csp and "base-uri 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"


def test_engine_output_is_escaped_everywhere(client: TestClient, seed: Any, wt: Any) -> None:
    gid = seed.finished(columns=wt.evil_columns(), name=f"n{wt.IMG}")
    html = client.get(f"/gates/{gid}").text
    assert wt.SCRIPT not in html and wt.IMG not in html and "<img" not in html
    assert "&lt;script&gt;window.__pwned = 1" in html
    assert "onerror=&#34;window.__pwned" in html or "onerror=&quot;window.__pwned" in html
    listing = client.get("/").text
    assert wt.IMG not in listing and "&lt;img src=x" in listing


def test_running_gate_page_polls_with_a_nonce(client: TestClient, seed: Any) -> None:
    gid = seed.live(progress={"scenario": "steady", "done": 30, "total": 120})
    r = client.get(f"/gates/{gid}")
    assert r.status_code == 200
    nonce = _nonce(r.headers["content-security-policy"])
    scripts = re.findall(r"<script([^>]*)>", r.text)
    assert scripts == [f' nonce="{nonce}"']
    assert f'data-poll="/v1/gates/{gid}"' in r.text
    assert "scenario steady: 30 of 120 responses (25%)" in r.text
    assert 'value="25"' in r.text
    # A fresh nonce on every response.
    again = client.get(f"/gates/{gid}").headers["content-security-policy"]
    assert _nonce(again) != nonce


def test_progress_text() -> None:
    assert progress_view("pending", "queued", None) == {"pct": None, "text": "waiting for a worker"}
    assert progress_view("running", "reference:healthy", None)["text"] == (
        "phase reference:healthy"
    )
    assert progress_view("running", "x", {"scenario": "s", "done": 5, "total": 0}) == {
        "pct": None,
        "text": "scenario s: 5 responses",
    }
    assert progress_view("running", "x", {"scenario": "s", "done": 50, "total": 200})["pct"] == 25


def test_list_filters_and_pages(client: TestClient, seed: Any, wt: Any) -> None:
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    for i in range(27):
        seed.finished(
            wt.evil_document("x", f"old-{i}"),
            name=f"old-{i}",
            verdict="continue" if i % 3 else "hold",
            candidate=f"vllm:0.{i}",
            created_at=t0 + timedelta(minutes=i),
        )
    seed.live(name="now-running", candidate="sglang:0.4", created_at=t0 + timedelta(hours=2))
    seed.live(
        name="now-pending", state="pending", phase="queued", created_at=t0 + timedelta(hours=3)
    )

    first = client.get("/").text
    assert "Showing 1–25 of 29 gates" in first
    assert first.index("now-pending") < first.index("now-running") < first.index("old-26")
    assert "old-1<" not in first.replace("</strong>", "<")  # the oldest are on page 2
    older = re.search(r'href="([^"]+)" rel="next"', first)
    assert older is not None
    second = client.get(older.group(1).replace("&amp;", "&")).text
    assert "Showing 26–29 of 29" in second and "old-0" in second and 'rel="prev"' in second

    running = client.get("/?state=running").text
    assert "now-running" in running and "now-pending" not in running and "old-3" not in running
    holds = client.get("/?verdict=hold").text
    assert "Showing 1–9 of 9" in holds and 'value="hold" selected' in holds
    by_candidate = client.get("/?candidate=sglang").text
    assert "Showing 1–1 of 1" in by_candidate and 'value="sglang"' in by_candidate
    # Filters survive paging; an unknown state or page is ignored, not a 422.
    assert client.get("/?state=bogus&page=zzz").status_code == 200
    paged = client.get("/?verdict=continue").text
    assert "Showing 1–18 of 18" in paged
    assert "No gates match these filters" in client.get("/?candidate=nothing-like-it").text


def test_unknown_gate_is_a_404_page(client: TestClient, wt: Any) -> None:
    r = client.get(f"/gates/{wt.IMG}")
    assert r.status_code == 404 and "No such gate" in r.text and "<img" not in r.text


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/gates/abc?x=1", "/gates/abc?x=1"),
        ("/", "/"),
        ("//evil.example/x", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("javascript:alert(1)", "/"),
        ("/ok\r\nSet-Cookie: x=1", "/"),
        ("", "/"),
        (None, "/"),
    ],
)
def test_safe_next(given: str | None, expected: str) -> None:
    assert safe_next(given) == expected


@pytest.fixture
def closed(tmp_path: Path, wt: Any) -> Iterator[tuple[TestClient, str, Any]]:
    settings = Settings(data_dir=tmp_path / "closed", open_reads=False)
    app = create_app(settings, start_workers=False)
    factory = app.state.ctx.factory
    token = create_token(factory, "reader", ["read"])
    # A browser on our pages says where its posts come from (the login post must).
    with TestClient(app, headers={"Origin": settings.public_url}) as c:
        yield c, token, wt.Seed(factory)


def test_pages_need_a_token_and_login_sets_the_cookie(
    closed: tuple[TestClient, str, Any], wt: Any
) -> None:
    client, token, seed = closed
    gid = seed.finished(columns=wt.evil_columns())
    r = client.get(f"/gates/{gid}?tab=1", follow_redirects=False)
    assert r.status_code == 303
    where = urlsplit(r.headers["location"])
    assert where.path == "/login"
    assert parse_qs(where.query) == {"next": [f"/gates/{gid}?tab=1"]}
    form = client.get(r.headers["location"])
    assert form.status_code == 200 and f'value="/gates/{gid}?tab=1"' in form.text
    assert 'type="password"' in form.text

    bad = client.post(
        "/login", data={"token": "gt_nope", "next": f"/gates/{gid}"}, follow_redirects=False
    )
    assert bad.status_code == 401 and "unknown or revoked" in bad.text
    assert f'value="/gates/{gid}"' in bad.text and "set-cookie" not in bad.headers

    good = client.post(
        "/login", data={"token": token, "next": f"/gates/{gid}"}, follow_redirects=False
    )
    assert good.status_code == 303 and good.headers["location"] == f"/gates/{gid}"
    cookie = good.headers["set-cookie"]
    assert cookie.startswith("gate_session=gs_") and token not in cookie
    for attr in ("HttpOnly", "Path=/", "SameSite=strict"):
        assert attr.lower() in cookie.lower(), cookie
    assert "secure" not in cookie.lower()  # plain http, and the public URL is http too
    page = client.get(f"/gates/{gid}")  # the client keeps the cookie
    assert page.status_code == 200 and "Sign out" in page.text

    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert csrf is not None
    out = client.post("/logout", data={"csrf_token": csrf.group(1)}, follow_redirects=False)
    assert out.status_code == 303 and 'gate_session=""' in out.headers["set-cookie"]
    client.cookies.clear()
    assert client.get("/", follow_redirects=False).status_code == 303


def test_login_refuses_open_redirects_and_bearer_works(
    closed: tuple[TestClient, str, Any], wt: Any
) -> None:
    client, token, _ = closed
    for evil in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        r = client.post("/login", data={"token": token, "next": evil}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/", evil
    assert client.get("/login?next=//evil.example").text.count('value="/"') == 1
    client.cookies.clear()
    r = client.get("/", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and "<h1>Gates</h1>" in r.text
    bad = client.post(
        "/login",
        content=b'{"token": "x"}',
        headers={"content-type": "application/json"},
        follow_redirects=False,
    )
    assert bad.status_code == 415
    assert wt.EVIL not in bad.text


def test_the_cookie_is_secure_behind_a_tls_proxy(tmp_path: Path) -> None:
    """The service sees http from the proxy; its public URL says https: Secure is set."""
    settings = Settings(
        data_dir=tmp_path / "tls", open_reads=False, public_url="https://gate.example"
    )
    app = create_app(settings, start_workers=False)
    token = create_token(app.state.ctx.factory, "reader", ["read"])
    with TestClient(app, headers={"Origin": "https://gate.example"}) as client:
        r = client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    assert r.status_code == 303
    assert "secure" in [a.strip().lower() for a in r.headers["set-cookie"].split(";")]


def test_the_list_and_the_page_say_continue_with_warnings(client: TestClient, seed: Any) -> None:
    """Issue 28 item 6 on the pages: the list's verdict and the page's title say the banner
    every surface says, and the list shows the summary line under it."""
    from verdicts import CONTINUE_LINE, mixed_document

    gid = seed.finished(mixed_document(hold=False).to_json(), name="warned", verdict="continue")
    page = client.get(f"/gates/{gid}").text
    assert "<title>CONTINUE, with 2 warnings · warned" in page
    listed = client.get("/").text
    row = listed.split(f'href="/gates/{gid}"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="pill continue">CONTINUE, with 2 warnings</span>' in row
    assert f'<span class="muted summary">{CONTINUE_LINE}</span>' in row
