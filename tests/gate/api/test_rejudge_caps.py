"""The rejudge endpoint is bounded by the policy's caps: the same model as a spec's policy."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_rejudge_refuses_a_policy_over_the_caps(
    app_client: TestClient, tokens: dict[str, str]
) -> None:
    run = {"Authorization": f"Bearer {tokens['run']}"}
    heavy = {"policy": {"bootstrap_resamples": 2_000_000, "look_every": 1}}
    r = app_client.post("/v1/gates/nope:rejudge", json=heavy, headers=run)
    assert r.status_code == 422, r.text  # refused before any gate is read or judged
    problems = {p["path"]: p["message"] for p in r.json()["error"]["problems"]}
    assert set(problems) == {"policy.bootstrap_resamples", "policy.look_every"}
    assert "20000" in problems["policy.bootstrap_resamples"]
    # within the caps, the same call reaches the gate lookup (there is no such gate)
    ok = {"policy": {"bootstrap_resamples": 20_000}}
    assert app_client.post("/v1/gates/nope:rejudge", json=ok, headers=run).status_code == 404
