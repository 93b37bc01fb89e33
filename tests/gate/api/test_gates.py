"""`/v1/gates` on the real app: auth, validation, a real gate run by the in-process worker,
idempotency, the Argo verdict object, cancel, re-judge, listing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from apitools import DECIDES, auth, poll_finished, spec_dict, wait_for
from fastapi.testclient import TestClient

from gate.access import tokens as token_mod
from gate.core.settings import Settings
from gate.verdict import RejudgeResult, VerdictDocument

pytestmark = pytest.mark.slow


def test_no_token_is_401_with_the_scheme(app_client: TestClient) -> None:
    r = app_client.get("/v1/gates")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert "read" in r.json()["error"]["message"]


def test_unknown_token_is_401(app_client: TestClient) -> None:
    r = app_client.get("/v1/gates", headers=auth("gt_not-a-real-token"))
    assert r.status_code == 401
    assert r.json()["error"]["message"] == "unknown or revoked token"


def test_read_token_cannot_start_gates(
    app_client: TestClient, tokens: dict[str, str], tag: str
) -> None:
    r = app_client.post("/v1/gates", json={"spec": spec_dict(tag)}, headers=auth(tokens["read"]))
    assert r.status_code == 403
    assert "'run' scope" in r.json()["error"]["message"]
    assert app_client.get("/v1/gates", headers=auth(tokens["read"])).json()["total"] == 0


def test_scopes_nest_and_tokens_are_stored_hashed(
    app_client: TestClient, tokens: dict[str, str]
) -> None:
    from sqlalchemy import select

    from gate.core.database import transaction
    from gate.models import ApiToken

    factory = app_client.app.state.ctx.factory  # type: ignore[attr-defined]
    with transaction(factory) as s:
        rows = {t.name: t for t in s.scalars(select(ApiToken))}
    assert rows["test-admin"].scopes == "read,run,admin"
    assert rows["test-run"].scopes == "read,run"
    for name, tok in tokens.items():
        assert rows[f"test-{name}"].token_hash == token_mod.digest(tok)
        assert tok not in (rows[f"test-{name}"].token_hash,)
    # an admin token reads too
    assert app_client.get("/v1/gates", headers=auth(tokens["admin"])).status_code == 200


def test_revoked_token_stops_working(
    app_client: TestClient, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(token_mod, "CACHE_S", 0.0)
    factory = app_client.app.state.ctx.factory  # type: ignore[attr-defined]
    assert app_client.get("/v1/gates", headers=auth(tokens["read"])).status_code == 200
    assert token_mod.revoke(factory, "test-read") == 1
    assert app_client.get("/v1/gates", headers=auth(tokens["read"])).status_code == 401


def test_open_reads_lets_reads_through_but_not_runs(settings: Settings, tag: str) -> None:
    from gate.api.app import create_app

    app = create_app(settings.model_copy(update={"open_reads": True}))
    with TestClient(app) as c:
        assert c.get("/v1/gates").status_code == 200
        assert c.post("/v1/gates", json={"spec": spec_dict(tag)}).status_code == 401


def test_spec_mistakes_are_named_by_field(app_client: TestClient, tokens: dict[str, str]) -> None:
    bad = spec_dict("x")
    bad["scenarios"][0]["rate"] = -3
    bad["candidate"] = {"url": "not a url"}
    del bad["model"]
    r = app_client.post("/v1/gates", json={"spec": bad}, headers=auth(tokens["run"]))
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_spec"
    paths = {p["path"] for p in err["problems"]}
    assert {"model", "candidate.url", "scenarios[0].rate"} <= paths, paths


def test_unknown_body_field_and_both_spec_kinds_are_422(
    app_client: TestClient, tokens: dict[str, str]
) -> None:
    r = app_client.post("/v1/gates", json={"specc": {}}, headers=auth(tokens["run"]))
    assert r.status_code == 422
    assert r.json()["error"]["problems"][0]["path"] == "specc"
    r = app_client.post(
        "/v1/gates", json={"spec": {}, "spec_name": "x"}, headers=auth(tokens["run"])
    )
    assert r.status_code == 422
    assert r.json()["error"]["problems"][0]["path"] == "spec"


def test_oversized_body_is_413(app_client: TestClient, tokens: dict[str, str]) -> None:
    big = {"spec": {"name": "x" * 2_000_000}}
    r = app_client.post("/v1/gates", json=big, headers=auth(tokens["run"]))
    assert r.status_code == 413
    assert "limit" in r.json()["error"]["message"]


def test_oversized_chunked_body_is_413(app_client: TestClient, tokens: dict[str, str]) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(30):
            yield b" " * 50_000

    r = app_client.post(
        "/v1/gates",
        content=chunks(),
        headers={**auth(tokens["run"]), "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "body_too_large"


def test_unknown_gate_is_404(app_client: TestClient, tokens: dict[str, str]) -> None:
    r = app_client.get("/v1/gates/nope", headers=auth(tokens["read"]))
    assert r.status_code == 404
    assert r.json()["error"] == {"code": "not_found", "message": "no gate with id 'nope'"}


# timed_gate: a hold on a TTFT regression of +50-100% that the paired latency checks must
# decide; other tests on the cores blur it, now and then to undecided (a continue).
@pytest.mark.timed_gate
def test_a_gate_runs_to_a_verdict_and_can_be_rejudged(
    app_client: TestClient, tokens: dict[str, str], tag: str, find_processes: Any
) -> None:
    # the candidate's time to first token is 1.5x the reference's: a hold (a scenario long
    # enough for the paired latency checks to decide)
    body = {"spec": spec_dict(tag, cand_flags=("--ttft-ms", "30"), **DECIDES)}
    r = app_client.post("/v1/gates", json=body, headers=auth(tokens["run"]))
    assert r.status_code == 202, r.text
    created = r.json()
    gid = created["id"]
    assert r.headers["location"] == f"/v1/gates/{gid}"
    assert created["links"]["verdict"] == f"/v1/gates/{gid}/verdict"
    assert created["state"] in ("pending", "running")

    # while it runs: 200 with a null verdict (what Argo polls)
    early = app_client.get(f"/v1/gates/{gid}/verdict", headers=auth(tokens["read"])).json()
    if early["state"] in ("pending", "running"):
        assert early["verdict"] is None

    final = poll_finished(app_client, gid, tokens["read"])
    assert final["state"] == "complete", final
    assert final["verdict"] == "hold"
    assert final["worker"].startswith("api@")
    summary = app_client.get(f"/v1/gates/{gid}/verdict", headers=auth(tokens["read"])).json()
    assert summary == {
        "id": gid,
        "state": "complete",
        "verdict": "hold",
        "reason": final["reason"],
        "summary": final["summary"],
        "warnings": final["warnings"],
        "warnings_omitted": final["warnings_omitted"],
        "not_shown": final["not_shown"],
        "not_shown_omitted": final["not_shown_omitted"],
        "advisory": [],
        "advisory_omitted": 0,
        "report_url": f"http://gate.test/gates/{gid}",
    }
    assert summary["summary"].startswith("hold: ") and ".ttft." in summary["summary"]
    assert "TTFT" in summary["reason"]
    doc = app_client.get(f"/v1/gates/{gid}/document", headers=auth(tokens["read"])).json()
    VerdictDocument.model_validate(doc)  # the shape the OpenAPI document gives is the one served
    read = auth(tokens["read"])
    seen = app_client.get(f"/v1/gates/{gid}/phases", headers=read).json()
    assert seen[0]["role"] == "gate" and seen[0]["phase"] == "requested"
    assert {"released", "judging"} <= {p["phase"] for p in seen if p["role"] == "gate"}
    assert [p["id"] for p in seen] == sorted(p["id"] for p in seen)
    later = app_client.get(f"/v1/gates/{gid}/phases?after={seen[2]['id']}", headers=read).json()
    assert later == seen[3:]
    assert app_client.get("/v1/gates/nope/phases", headers=read).status_code == 404
    failing = {c["check"] for c in doc["reasons"]}
    assert any("ttft" in c for c in failing)
    assert not find_processes(tag), "engines outlived the gate"

    # re-judging spends the service's CPU on a whole judge: a read token may not
    loose = {"policy": {"tolerance": {"p50": 1.0, "p90": 1.0, "p99": 1.0}}}
    denied = app_client.post(f"/v1/gates/{gid}:rejudge", json=loose, headers=auth(tokens["read"]))
    assert denied.status_code == 403
    # the same samples under a policy that tolerates 2x TTFT: the TTFT checks pass
    r = app_client.post(f"/v1/gates/{gid}:rejudge", json=loose, headers=auth(tokens["run"]))
    assert r.status_code == 200, r.text
    redo = r.json()
    RejudgeResult.model_validate(redo)
    ttft = [c for c in redo["checks"] if c["metric"] == "ttft" and c.get("quantile")]
    assert ttft and all(c["decision"] == "pass" for c in ttft), ttft
    # and under its own default policy, the stored samples still hold on TTFT
    same = app_client.post(f"/v1/gates/{gid}:rejudge", json={}, headers=auth(tokens["run"])).json()
    assert same["verdict"] == "hold"
    assert same["summary"].startswith("hold: ") and ".ttft." in same["summary"]
    # judged the way the run judged (the early-stopped prefix, its warm-up): same reasons
    assert {c["id"] for c in same["reasons"]} == {c["check"] for c in doc["reasons"]}
    stopped = [sc["early_stop"] for sc in doc["scenarios"] if sc.get("early_stop")]
    if stopped:
        steady = next(c for c in same["checks"] if c["id"] == "steady.ttft.p50")
        assert steady["samples"][0] == stopped[0]["requests"]
    bad = app_client.post(
        f"/v1/gates/{gid}:rejudge",
        json={"policy": {"alpha": 7}},
        headers=auth(tokens["run"]),
    )
    assert bad.status_code == 422
    assert bad.json()["error"]["problems"][0]["path"].startswith("policy.alpha")

    # listing and filters
    read = auth(tokens["read"])
    assert app_client.get("/v1/gates?verdict=hold", headers=read).json()["total"] == 1
    assert app_client.get("/v1/gates?verdict=continue", headers=read).json()["total"] == 0
    assert app_client.get("/v1/gates?state=complete", headers=read).json()["gates"][0]["id"] == gid
    assert app_client.get("/v1/gates?candidate=nothing-like-it", headers=read).json()["total"] == 0
    assert app_client.get("/v1/gates?state=bogus", headers=read).status_code == 422
    # a finished gate cannot be cancelled
    r = app_client.post(f"/v1/gates/{gid}:cancel", headers=auth(tokens["run"]))
    assert r.status_code == 409


def test_idempotency_key_and_ensure_never_start_a_second_gate(
    app_client: TestClient, tokens: dict[str, str], tag: str
) -> None:
    run = auth(tokens["run"])
    body = {"spec": spec_dict(tag, requests=400, rate=80)}
    a = app_client.post("/v1/gates", json=body, headers={**run, "Idempotency-Key": "k1"})
    b = app_client.post("/v1/gates", json=body, headers={**run, "Idempotency-Key": "k1"})
    assert (a.status_code, b.status_code) == (202, 200)
    assert a.json()["id"] == b.json()["id"]

    e1 = app_client.post("/v1/gates:ensure", json=body, headers=run)
    e2 = app_client.post("/v1/gates:ensure", json=body, headers=run)
    assert e1.status_code == e2.status_code == 200
    assert e1.json()["id"] == e2.json()["id"] != a.json()["id"]
    assert e1.json()["verdict"] is None
    assert set(e1.json()) == {
        "id",
        "state",
        "verdict",
        "reason",
        "summary",
        "warnings",
        "warnings_omitted",
        "not_shown",
        "not_shown_omitted",
        "advisory",
        "advisory_omitted",
        "report_url",
    }
    assert e1.json()["summary"] is None  # null until decided, as the verdict
    other = {"spec": spec_dict(tag, requests=60, cand_flags=("--ttft-ms", "21"))}
    e3 = app_client.post("/v1/gates:ensure", json=other, headers=run)
    assert e3.json()["id"] != e1.json()["id"]
    total = app_client.get("/v1/gates", headers=auth(tokens["read"])).json()["total"]
    assert total == 3
    final = wait_for(
        lambda: (
            (r := app_client.post("/v1/gates:ensure", json=body, headers=run).json())["state"]
            == "complete"
            and r
        ),
        timeout=180,
        what="the ensured gate to complete",
    )
    assert final["id"] == e1.json()["id"]
    assert final["verdict"] in ("continue", "hold")  # identical engines; a busy machine may
    # leave a required check undecided, which holds: what matters here is that it is one gate
    assert app_client.get("/v1/gates", headers=auth(tokens["read"])).json()["total"] == 3
    # A deliberate second run of the same spec (a retried rollout): another key, a new gate,
    # itself idempotent; the first gate's verdict stays what it was.
    again = {**body, "key": "attempt-2"}
    r1 = app_client.post("/v1/gates:ensure", json=again, headers=run).json()
    r2 = app_client.post("/v1/gates:ensure", json=again, headers=run).json()
    assert r1["id"] == r2["id"] != final["id"]
    assert app_client.post(f"/v1/gates/{r1['id']}:cancel", headers=run).status_code == 202
    assert app_client.post("/v1/gates:ensure", json=body, headers=run).json() == final
    bad = app_client.post("/v1/gates:ensure", json={**body, "key": ""}, headers=run)
    assert bad.status_code == 422 and bad.json()["error"]["problems"][0]["path"] == "key"


def test_cancel_a_running_gate_tears_it_down(
    app_client: TestClient, tokens: dict[str, str], tag: str, find_processes: Any
) -> None:
    body = {"spec": spec_dict(tag, requests=4000, rate=20)}
    gid = app_client.post("/v1/gates", json=body, headers=auth(tokens["run"])).json()["id"]
    read = auth(tokens["read"])
    wait_for(
        lambda: (app_client.get(f"/v1/gates/{gid}", headers=read).json().get("progress") or {}).get(
            "done"
        ),
        timeout=60,
        what="load to flow",
    )
    assert len(find_processes(tag)) == 2
    r = app_client.post(f"/v1/gates/{gid}:cancel", headers=auth(tokens["run"]))
    assert r.status_code == 202
    assert r.json()["cancel_requested"] is True
    final = poll_finished(app_client, gid, tokens["read"], timeout=60)
    assert final["state"] == "cancelled"
    assert final["verdict"] == "hold"
    assert "cancelled on request" in final["reason"]
    assert not find_processes(tag)
    res = app_client.get("/v1/reservations?active=false", headers=read).json()
    mine = [x for x in res if x["gate_id"] == gid]
    assert mine and mine[0]["state"] == "released"
    assert app_client.get("/v1/reservations", headers=read).json() == []
    cancelled = app_client.get(f"/v1/gates/{gid}/document", headers=read).json()
    assert VerdictDocument.model_validate(cancelled).verdict == "hold"


def test_stopping_the_service_cancels_its_running_gates(
    settings: Settings, tag: str, find_processes: Any
) -> None:
    from gate.access.tokens import create_token
    from gate.api.app import create_app
    from gate.service import service

    app = create_app(settings)
    factory = app.state.ctx.factory
    token = create_token(factory, "t", ["run"])
    with TestClient(app) as client:
        body = {"spec": spec_dict(tag, requests=4000, rate=20)}
        gid = client.post("/v1/gates", json=body, headers=auth(token)).json()["id"]
        wait_for(
            lambda: (service.get_gate(factory, gid).progress or {}).get("done"),
            timeout=60,
            what="load to flow",
        )
    # the lifespan's end waited for the runner: torn down, released, recorded
    run = service.get_gate(factory, gid)
    assert (run.state, run.verdict) == ("cancelled", "hold")
    assert "was stopped before the gate could decide" in (run.reason or "")
    assert not find_processes(tag)
    from sqlalchemy import select

    from gate.core.database import transaction
    from gate.models import GpuLease

    with transaction(factory) as s:
        assert s.scalars(select(GpuLease)).all() == []
