"""`/v1/docs` from the package's own files: no CDN, no script, under the pages' CSP; the
operator may hide it and `/v1/openapi.json` (GATE_API_DOCS=false)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from gate.api.app import create_app
from gate.core.settings import Settings


def test_the_docs_page_is_our_own_html_under_the_pages_csp(app_client: TestClient) -> None:
    r = app_client.get("/v1/docs")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert csp.startswith("default-src 'none'; script-src 'nonce-")
    assert r.headers["x-content-type-options"] == "nosniff"
    html = r.text
    # nothing from another origin, and no script at all: it reads on an air-gapped cluster
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "swagger" not in html.lower() and "cdn" not in html.lower()
    # every operation of the OpenAPI document, and its schemas, linked by name
    doc = app_client.get("/v1/openapi.json").json()
    for path, item in doc["paths"].items():
        for method in item:
            assert f"<code>{method.upper()} {path}</code>" in html, (method, path)
    assert 'id="schema-GateView"' in html and 'href="#schema-ErrorBody"' in html
    assert "List gates" in html  # a summary
    assert "Idempotency-Key" in html  # a header parameter


def test_the_operator_can_hide_the_docs(settings: Settings) -> None:
    hidden = settings.model_copy(update={"api_docs": False})
    with TestClient(create_app(hidden)) as client:
        for path in ("/v1/docs", "/v1/openapi.json", "/docs", "/redoc"):
            r = client.get(path)
            assert r.status_code == 404, path
            assert r.json()["error"]["code"] == "not_found"
        assert client.get("/v1/gates").status_code == 401  # the API itself is served
        assert 'href="/v1/docs"' not in client.get("/login").text  # no link to a 404
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/openapi.json").status_code == 200
        assert 'href="/v1/docs"' in client.get("/login").text
        assert client.get("/docs").status_code == 404  # FastAPI's own CDN page: never
