"""Requests answered truthfully while the broker is down: a gate that was stored is answered
202 with its id (the reapers queue it once the broker is back), never a 500; an unexpected
failure is the documented JSON error shape, never plain text."""

from __future__ import annotations

import logging

import pytest
from apitools import auth, spec_dict
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings
from gate.service import service

DOWN = "redis://127.0.0.1:9/0"  # nothing listens on port 9


def test_a_post_while_the_broker_is_down_answers_202_for_the_stored_gate(
    settings: Settings, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(settings.model_copy(update={"broker_url": DOWN}))
    with TestClient(app) as client, caplog.at_level(logging.WARNING):
        factory = app.state.ctx.factory
        token = create_token(factory, "ci", ["run"])
        r = client.post("/v1/gates", json={"spec": spec_dict(tag)}, headers=auth(token))
        assert r.status_code == 202, r.text
        gate_id = r.json()["id"]
        assert r.headers["Location"] == f"/v1/gates/{gate_id}"
        assert service.get_gate(factory, gate_id).state == "pending"  # it exists: 202, not 500
        again = client.get(f"/v1/gates/{gate_id}", headers=auth(token))
        assert again.status_code == 200 and again.json()["state"] == "pending"
    assert any(
        "the broker did not take its task" in rec.getMessage() and gate_id in rec.getMessage()
        for rec in caplog.records
    )


def test_an_unexpected_failure_is_the_json_error_shape(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        token = create_token(app.state.ctx.factory, "r", ["read"])

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(service, "list_gates", broken)
        r = client.get("/v1/gates", headers=auth(token))
    assert r.status_code == 500
    assert r.headers["content-type"].startswith("application/")
    error = r.json()["error"]
    assert error["code"] == "internal_error" and "see its log" in error["message"]


def test_a_database_outage_is_a_503_with_retry_after(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        token = create_token(app.state.ctx.factory, "r", ["read"])

        def down(*args: object, **kwargs: object) -> None:
            raise OperationalError("SELECT 1", {}, ConnectionError("server closed the connection"))

        monkeypatch.setattr(service, "list_gates", down)
        r = client.get("/v1/gates", headers=auth(token))
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    assert r.json()["error"]["code"] == "database_unavailable"
