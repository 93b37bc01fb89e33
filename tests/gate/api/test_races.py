"""Idempotency under concurrency, on SQLite and on a real PostgreSQL: many rollout-controller
polls racing to ensure the same gate start exactly one."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from apitools import SIM_TEMPLATE, Recording, auth, spec_dict
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'race.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_concurrent_ensures_start_one_gate(database: str, tmp_path: Path) -> None:
    app = create_app(
        Settings(data_dir=tmp_path / ".gate", database_url=database, engines={"sim": SIM_TEMPLATE}),
        start_workers=False,
    )
    recording = Recording()
    app.state.ctx.dispatcher = recording
    token = create_token(app.state.ctx.factory, "argo", ["run"])
    body = {"spec": spec_dict("race")}
    with TestClient(app) as client:

        def ensure(_: int) -> str:
            r = client.post("/v1/gates:ensure", json=body, headers=auth(token))
            assert r.status_code == 200, r.text
            return str(r.json()["id"])

        with ThreadPoolExecutor(max_workers=16) as pool:
            ids = set(pool.map(ensure, range(64)))
        assert len(ids) == 1
        assert recording.submitted == [ids.pop()]
        listed = client.get("/v1/gates", headers=auth(token)).json()
        assert listed["total"] == 1


def test_concurrent_webhook_redeliveries_start_one_gate(database: str, tmp_path: Path) -> None:
    import json
    import time

    from gate.integrations.signatures import sign

    app = create_app(
        Settings(
            data_dir=tmp_path / ".gate",
            database_url=database,
            webhook_secret="s",
            engines={"sim": SIM_TEMPLATE},
        ),
        start_workers=False,
    )
    recording = Recording()
    app.state.ctx.dispatcher = recording
    raw = json.dumps(
        {"delivery_id": "same", "timestamp": time.time(), "spec": spec_dict("race")}
    ).encode()
    headers = {"Content-Type": "application/json", "X-Hub-Signature-256": sign("s", raw)}
    with TestClient(app) as client:

        def deliver(_: int) -> tuple[int, str]:
            r = client.post("/v1/webhooks/ci", content=raw, headers=headers)
            return r.status_code, str(r.json()["gate"]["id"])

        with ThreadPoolExecutor(max_workers=12) as pool:
            answers = list(pool.map(deliver, range(36)))
    codes = [c for c, _ in answers]
    assert codes.count(202) == 1 and codes.count(200) == 35, codes
    assert len({g for _, g in answers}) == 1
    assert len(recording.submitted) == 1
