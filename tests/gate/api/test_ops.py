"""Capacity, inventory, reservations and /metrics on the real app."""

from __future__ import annotations

import pytest
from apitools import auth
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gate.api.app import create_app
from gate.api.documents import CapacityDoc, InventoryDoc
from gate.core.settings import Settings
from gate.service import service
from gate.spec import parse_spec


def test_capacity_and_inventory(app_client: TestClient, tokens: dict[str, str]) -> None:
    read = auth(tokens["read"])
    cap = app_client.get("/v1/capacity?shape=sku=H200,gpus_per_engine=1", headers=read).json()
    assert cap["gates"] >= 1
    assert cap["shape"]["gpus_per_engine"] == 1
    inv = app_client.get("/v1/inventory", headers=read).json()
    assert inv["gpus"] == sum(n["gpus"] for n in inv["nodes"])
    assert inv["held_by_gates"] == 0
    # The shapes the OpenAPI document gives for them are the shapes served
    CapacityDoc.model_validate(cap)
    InventoryDoc.model_validate(inv)
    blocked = app_client.get("/v1/capacity?shape=sku=B200,gpus_per_engine=8", headers=read)
    assert blocked.status_code == 200, blocked.text
    none = CapacityDoc.model_validate(blocked.json())
    assert none.gates == 0 and none.blocked is not None
    bad = app_client.get("/v1/capacity?shape=gpus_per_engine=lots", headers=read)
    assert bad.status_code == 422
    assert bad.json()["error"]["problems"][0]["path"] == "shape"
    assert app_client.get("/v1/reservations", headers=read).json() == []
    # Whole engines of two worker groups: 2 x (1 + 2) GPUs fit the one host once.
    pd = app_client.get(
        "/v1/capacity",
        params={"shape": "groups=prefill:1+decode:2,connect=prefill/decode@host"},
        headers=read,
    ).json()
    assert pd["gates"] == 1 and [g["role"] for g in pd["groups"]] == ["decode", "prefill"]
    assert [g["role"] for g in pd["shape"]["groups"]] == ["prefill", "decode"]
    CapacityDoc.model_validate(pd)
    unknown = app_client.get(
        "/v1/capacity",
        params={"shape": "groups=prefill:1+decode:2,connect=prefill/nope@host"},
        headers=read,
    )
    assert unknown.status_code == 422 and "unknown group 'nope'" in unknown.text


def test_metrics_count_gates_by_state_and_verdict(
    app_client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    from apitools import spec_dict

    factory = app_client.app.state.ctx.factory  # type: ignore[attr-defined]
    spec = parse_spec(spec_dict("m", trusted=True))
    run, _ = service.create_gate(factory, spec, source="api")
    service.request_cancel(factory, run.id, admin=True)  # pending -> cancelled at once, hold
    text = app_client.get("/metrics", headers=auth(tokens["read"])).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    gates = {
        (s.labels["state"], s.labels["verdict"]): s.value for s in families["gate_gates"].samples
    }
    assert gates[("cancelled", "hold")] == 1
    assert families["gate_reservations_active"].samples[0].value == 0
    assert families["gate_capacity_gpus"].samples[0].value > 0
    assert "gate_queue_depth" in families


@pytest.mark.parametrize("path", ["/v1/openapi.json"])
def test_openapi_lists_every_route(app_client: TestClient, path: str) -> None:
    doc = app_client.get(path).json()
    paths = set(doc["paths"])
    for p in (
        "/v1/gates",
        "/v1/gates:ensure",
        "/v1/gates/{gate_id}",
        "/v1/gates/{gate_id}/verdict",
        "/v1/gates/{gate_id}/document",
        "/v1/gates/{gate_id}:cancel",
        "/v1/gates/{gate_id}:rejudge",
        "/v1/webhooks/ci",
        "/v1/webhooks/flagger/{hook_type}",
        "/v1/capacity",
        "/v1/reservations",
        "/v1/inventory",
    ):
        assert p in paths, p
    assert doc["components"]["schemas"]["VerdictSummary"]["required"] == [
        "id",
        "state",
        "verdict",
        "reason",
        "summary",
        "warnings",
        "warnings_omitted",
        "not_shown",
        "not_shown_omitted",
        "report_url",
    ]


def test_metrics_needs_a_token(app_client: TestClient, tokens: dict[str, str]) -> None:
    """Gate counts, queue depth and capacity are reads: no token, no metrics."""
    bare = app_client.get("/metrics")
    assert bare.status_code == 401 and "gate_gates" not in bare.text
    assert bare.headers["www-authenticate"] == "Bearer"
    assert app_client.get("/metrics", headers=auth("gt_unknown")).status_code == 401
    # As Prometheus sends it: `authorization: {credentials: <token>}` is a Bearer header.
    scraped = app_client.get("/metrics", headers={"authorization": f"Bearer {tokens['read']}"})
    assert scraped.status_code == 200
    assert "gate_gates" in {f.name for f in text_string_to_metric_families(scraped.text)}


def test_open_metrics_opt_in(settings: Settings) -> None:
    assert Settings().open_metrics is False  # closed unless the operator opens it
    opened = settings.model_copy(update={"open_metrics": True})
    with TestClient(create_app(opened, start_workers=False)) as client:
        r = client.get("/metrics")
        assert r.status_code == 200 and "gate_gates" in r.text
        assert client.get("/v1/gates").status_code == 401  # only /metrics was opened


def test_open_metrics_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATE_OPEN_METRICS", "true")
    assert Settings().open_metrics is True
