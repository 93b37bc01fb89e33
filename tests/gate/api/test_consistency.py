"""Every endpoint names a gate's state and writes its timestamps the same way (issue 30): a
cancelled gate is `cancelled` in `/v1/gates/{id}`, the list, the verdict object, `gates:ensure`
and its document; every timestamp is ISO 8601 UTC ending in `Z`, whether the answer was made
from a row just written (the POST) or one read back from SQLite (naive there)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from apitools import SIM_TEMPLATE, Recording, auth, spec_dict
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.clock import utc_text
from gate.core.settings import Settings

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings = Settings(
        data_dir=tmp_path / ".gate", public_url="http://gate.test", engines={"sim": SIM_TEMPLATE}
    )
    app = create_app(settings, start_workers=False)
    app.state.ctx.dispatcher = Recording()  # gates stay pending: nothing is launched
    factory = app.state.ctx.factory
    tokens = {s: create_token(factory, f"c-{s}", [s]) for s in ("read", "run")}
    with TestClient(app, base_url="http://gate.test") as c:
        yield c, tokens


def stamps(view: dict[str, Any]) -> list[str]:
    return [view[k] for k in ("created_at", "started_at", "finished_at") if view[k] is not None]


def test_utc_text_is_one_form_for_naive_and_aware_times() -> None:
    aware = datetime(2026, 12, 6, 23, 3, 51, 161821, tzinfo=UTC)
    assert utc_text(aware) == "2026-12-06T23:03:51.161821Z"
    assert utc_text(aware.replace(tzinfo=None)) == "2026-12-06T23:03:51.161821Z"  # SQLite's
    assert utc_text(aware.astimezone(timezone(timedelta(hours=2)))) == utc_text(aware)
    assert utc_text(aware.replace(microsecond=0)) == "2026-12-06T23:03:51.000000Z"


def test_a_cancelled_gate_is_cancelled_everywhere_and_every_stamp_ends_in_z(
    client: tuple[TestClient, dict[str, str]],
) -> None:
    c, tokens = client
    run, read = auth(tokens["run"]), auth(tokens["read"])
    posted = c.post("/v1/gates", json={"spec": spec_dict("consistency")}, headers=run)
    assert posted.status_code == 202, posted.text
    gid = posted.json()["id"]
    got = c.get(f"/v1/gates/{gid}", headers=read).json()
    # The POST answers from the row it just wrote (aware), the GET from SQLite (naive): one form.
    assert posted.json()["created_at"] == got["created_at"]
    assert all(STAMP.match(s) for s in stamps(posted.json()) + stamps(got)), (posted.json(), got)

    cancelled = c.post(f"/v1/gates/{gid}:cancel", headers=run)
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    views = {
        "cancel": cancelled.json(),
        "get": c.get(f"/v1/gates/{gid}", headers=read).json(),
        "list": c.get("/v1/gates", headers=read).json()["gates"][0],
    }
    for where, view in views.items():
        assert view["state"] == "cancelled" and view["verdict"] == "hold", where
        assert view["finished_at"] is not None, where
        assert all(STAMP.match(s) for s in stamps(view)), (where, view)
    verdict = c.get(f"/v1/gates/{gid}/verdict", headers=read).json()
    assert (verdict["state"], verdict["verdict"]) == ("cancelled", "hold")  # it said "error"
    kept = c.app.state.ctx.finished_verdicts  # type: ignore[attr-defined]
    assert gid in kept  # a finished gate's answer is kept, cancelled ones too
    assert c.get(f"/v1/gates/{gid}/verdict", headers=read).json() == verdict
    document = c.get(f"/v1/gates/{gid}/document", headers=read).json()
    assert document["state"] == "cancelled"
    assert STAMP.match(document["finished_at"]), document["finished_at"]
    listed = c.get("/v1/gates?state=cancelled", headers=read).json()
    assert [g["id"] for g in listed["gates"]] == [gid]


def test_the_openapi_document_names_the_same_states(
    client: tuple[TestClient, dict[str, str]],
) -> None:
    c, _ = client
    schemas = c.get("/v1/openapi.json").json()["components"]["schemas"]
    states = {
        name: sorted(schemas[name]["properties"]["state"].get("enum", []))
        for name in ("GateView", "VerdictSummary")
    }
    assert states["GateView"] == states["VerdictSummary"], states
    assert "cancelled" in states["VerdictSummary"]
    created = schemas["GateView"]["properties"]["created_at"]
    assert (created["type"], created["format"]) == ("string", "date-time")
