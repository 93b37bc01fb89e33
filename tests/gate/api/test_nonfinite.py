"""NaN and Infinity in request bodies, on the real app: JSON has no such numbers, Python's and
pydantic's parsers accept them, and a NaN compares false with everything (a NaN timestamp
passed the CI webhook's replay window). Every JSON body with one is refused, naming the field,
before any route stores anything."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from apitools import SECRET, Recording, auth, spec_dict
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import func, select

from gate.api.integrations import CiDelivery, outside_window
from gate.core.database import transaction
from gate.http.guards import nonfinite_paths
from gate.integrations.signatures import sign
from gate.models import GateRun, WebhookDelivery

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]


@pytest.fixture
def client(app_client: TestClient) -> TestClient:
    app_client.app.state.ctx.dispatcher = Recording()  # type: ignore[attr-defined]
    return app_client


def rows(client: TestClient) -> tuple[int, int]:
    factory = client.app.state.ctx.factory  # type: ignore[attr-defined]
    with transaction(factory) as s:
        gates = s.scalar(select(func.count()).select_from(GateRun)) or 0
        deliveries = s.scalar(select(func.count()).select_from(WebhookDelivery)) or 0
    return int(gates), int(deliveries)


def with_literal(doc: dict[str, Any], literal: str) -> bytes:
    """The document as JSON, with the number 12345.5 written as `literal`."""
    raw = json.dumps(doc)
    assert raw.count("12345.5") == 1
    return raw.replace("12345.5", literal).encode()


def refused(r: Any, path: str, literal: str) -> None:
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["problems"] == [
        {"path": path, "message": f"{literal} is not a number JSON allows: give a finite number"}
    ]
    assert f"{path}: {literal}" in error["message"]


def spec_with(rate: float) -> dict[str, Any]:
    return spec_dict("nonfinite", rate=rate)


@pytest.mark.parametrize("literal", NON_FINITE)
def test_nan_in_any_json_body_is_refused(
    client: TestClient, tokens: dict[str, str], literal: str
) -> None:
    run = auth(tokens["run"])
    created = client.post("/v1/gates", json={"spec": spec_with(40.0)}, headers=run)
    assert created.status_code == 202, created.text  # the same body, finite: a gate
    gid = created.json()["id"]
    before = rows(client)
    cases = [
        ("/v1/gates", {"spec": spec_with(12345.5)}, "spec.scenarios.0.rate"),
        ("/v1/gates:ensure", {"spec": spec_with(12345.5)}, "spec.scenarios.0.rate"),
        (f"/v1/gates/{gid}:rejudge", {"policy": {"alpha": 12345.5}}, "policy.alpha"),
        (
            "/v1/webhooks/flagger/confirm-rollout",
            {"name": "x", "namespace": "y", "metadata": {"token": tokens["run"]}, "n": 12345.5},
            "n",
        ),
    ]
    for path, doc, field in cases:
        body = with_literal(doc, literal)
        r = client.post(path, content=body, headers={**run, "Content-Type": "application/json"})
        refused(r, field, literal)
    assert rows(client) == before  # nothing stored
    assert client.app.state.ctx.dispatcher.submitted == [gid]  # type: ignore[attr-defined]


def ci_delivery(delivery: str, timestamp: float) -> dict[str, Any]:
    return {"delivery_id": delivery, "timestamp": timestamp, "spec": spec_with(40.0)}


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize("content_type", ["application/json", "text/plain"])
def test_nan_timestamp_in_signed_ci_webhook_is_refused(
    client: TestClient, literal: str, content_type: str
) -> None:
    """A valid HMAC over a body whose timestamp is NaN: `abs(nan) > max_age` is false, so it
    would have passed the replay window forever. The route reads the raw body whatever its
    content type says, so the type does not matter either."""
    body = with_literal(ci_delivery("d-nan", 12345.5), literal)
    headers = {"Content-Type": content_type, "X-Hub-Signature-256": sign(SECRET, body)}
    r = client.post("/v1/webhooks/ci", content=body, headers=headers)
    refused(r, "timestamp", literal)
    assert rows(client) == (0, 0)  # no gate, no delivery row
    # The same delivery, finite and fresh, signed the same way, is taken: the body was fine.
    good = json.dumps(ci_delivery("d-nan", time.time())).encode()
    headers["X-Hub-Signature-256"] = sign(SECRET, good)
    ok = client.post("/v1/webhooks/ci", content=good, headers=headers)
    assert ok.status_code == 202, ok.text
    assert rows(client) == (1, 1)


def test_replay_window_itself_refuses_nan() -> None:
    """The second line: were a NaN to reach the window check, it is outside."""
    for age in (math.nan, math.inf, -math.inf, 301.0, -301.0):
        assert outside_window(age, 300.0), age
    for age in (0.0, 299.9, -299.9, 300.0):
        assert not outside_window(age, 300.0), age
    with pytest.raises(ValidationError, match="timestamp"):
        CiDelivery.model_validate_json('{"delivery_id": "d", "timestamp": NaN, "spec": {}}')


def test_nonfinite_paths() -> None:
    assert nonfinite_paths(b'{"a": [1, {"b": NaN}], "c": -Infinity, "d": 1e999}') == [
        ("a.1.b", "NaN"),
        ("c", "-Infinity"),
        ("d", "1e999"),
    ]
    assert nonfinite_paths(b"NaN") == [("(body)", "NaN")]
    assert nonfinite_paths(b'{"a": 1.5e300, "b": "NaN", "c": [1, 2]}') == []
    assert nonfinite_paths(b"token=abc&next=%2F") is None  # not JSON: the route decides
    assert nonfinite_paths(b"\xff\xfe\x00") is None
    deep = b"[" * 100_000 + b"]" * 100_000
    assert nonfinite_paths(deep) is None  # too deep for the parser: not refused here


def test_reading_bodies_stays_under_the_size_limit(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """The check reads whole bodies, through BodyLimit's count: a chunked body (no
    Content-Length) over GATE_MAX_BODY_BYTES is still refused with 413."""
    limit = client.app.state.ctx.settings.max_body_bytes  # type: ignore[attr-defined]

    def chunks() -> Any:
        yield b'{"spec": {"name": "'
        for _ in range(4 * limit // 65536):
            yield b"x" * 65536

    r = client.post(
        "/v1/gates",
        content=chunks(),
        headers={**auth(tokens["run"]), "Content-Type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert rows(client) == (0, 0)
