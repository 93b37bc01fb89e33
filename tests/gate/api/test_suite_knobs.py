"""A caller's suite scenario through the real API (security review): every bypass of the
caps through a suite's knobs is a 422 naming the field, never a 500 and never a stored gate;
the honest scenario with sampling parameters is accepted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from apitools import Recording, auth, spec_dict
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings


@pytest.fixture
def api(settings: Settings) -> Iterator[tuple[TestClient, Recording, str]]:
    app = create_app(settings, start_workers=False)
    recording = Recording()
    app.state.ctx.dispatcher = recording
    with TestClient(app) as client:
        token = create_token(app.state.ctx.factory, "ci", ["run"])
        yield client, recording, token


def _post(client: TestClient, token: str, tag: str, *scenarios: dict[str, Any]) -> Any:
    body = {**spec_dict(tag), "scenarios": list(scenarios)}
    # the raw JSON text, as a caller sends it (a 4000-digit number is valid JSON)
    text = json.dumps({"spec": body})
    return client.post(
        "/v1/gates",
        content=text,
        headers={**auth(token), "content-type": "application/json"},
    )


def _paths(r: Any) -> dict[str, str]:
    assert r.status_code == 422, r.text
    return {p["path"]: p["message"] for p in r.json()["error"]["problems"]}


def test_suite_knob_bypasses_are_422_naming_the_field(
    api: tuple[TestClient, Recording, str], tag: str
) -> None:
    client, recording, token = api
    repro = {
        "name": "a",
        "suite": "normal",
        "rate": "1e9",
        "requests": 20000,
        "max_tokens": "1000000",
        "extra": [["max_tokens", 10**9], ["min_tokens", 10**9], ["n", 64], ["prompt", "x " * 1000]],
    }
    paths = _paths(_post(client, token, tag, repro))
    assert {"scenarios[0].rate", "scenarios[0].max_tokens", "scenarios[0].extra"} <= set(paths)

    paths = _paths(_post(client, token, tag, {"suite": "normal", "rate": 10**4000}))
    assert "must be at most 100000 requests/s" in paths["scenarios[0].rate"]

    paths = _paths(
        _post(client, token, tag, {"suite": "peak", "burstiness": 1e-300, "max_tokens": [1, 2]})
    )
    assert {"scenarios[0].burstiness", "scenarios[0].max_tokens"} <= set(paths)

    extra = {"prompt_logprobs": 20, "use_beam_search": True, "model": "x", "stream": False}
    paths = _paths(_post(client, token, tag, {"suite": "recovery", "extra": extra}))
    assert {f"scenarios[0].extra.{k}" for k in extra} <= set(paths)

    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    paths = _paths(_post(client, token, tag, {"suite": "normal", "extra": {"stop": deep}}))
    assert "nested too deep" in paths["scenarios[0].extra"]
    paths = _paths(_post(client, token, tag, {"suite": "normal", "settings": {"extra": deep}}))
    assert any("nested too deep" in m for m in paths.values()), paths
    assert recording.submitted == []


def test_an_honest_suite_scenario_with_sampling_parameters_is_accepted(
    api: tuple[TestClient, Recording, str], tag: str
) -> None:
    client, recording, token = api
    sc = {
        "suite": "normal",
        "rate": 20,
        "requests": 100,
        "max_tokens": 64,
        "extra": {"temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n"], "logprobs": 5},
    }
    r = _post(client, token, tag, sc)
    assert r.status_code == 202, r.text
    assert len(recording.submitted) == 1
