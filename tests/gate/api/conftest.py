"""The API under test: the real app (FastAPI + SQLite + the in-process worker running real
sim engine processes), called through Starlette's TestClient."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from apitools import SECRET, SIM_TEMPLATE
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings


@pytest.fixture
def tag() -> str:
    return f"apitest-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    return Settings(
        data_dir=tmp_path / ".gate",
        heartbeat_s=0.5,
        lost_after_s=10,
        public_url="http://gate.test",
        spec_dir=spec_dir,
        webhook_secret=SECRET,
        callback_allow=["http://127.0.0.1:9/allowed/"],
        engines={"sim": SIM_TEMPLATE},  # callers' engines: the sim template's parameters
    )


@pytest.fixture
def app_client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings)
    with TestClient(app) as c:
        yield c


@pytest.fixture
def tokens(app_client: TestClient) -> dict[str, str]:
    factory = app_client.app.state.ctx.factory  # type: ignore[attr-defined]
    return {s: create_token(factory, f"test-{s}", [s]) for s in ("read", "run", "admin")}
