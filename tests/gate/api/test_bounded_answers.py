"""The attacks of the second review round on answer sizes, sent through the real app: every
error answer is bounded before auth and before routing (problems capped and counted), the
Flagger hook reads its token before its body, one byte limit holds every answer, and no string
a caller stores can make the gate lists grow (three gates with 300,000-character URLs once made
every list and the `/` page 1.8 MB)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from apitools import SECRET, Recording, auth, spec_dict
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gate.api.app import create_app
from gate.core.database import transaction
from gate.core.errors import MAX_PROBLEMS
from gate.core.settings import Settings
from gate.http.problems import MAX_ERROR_BYTES
from gate.integrations.signatures import sign
from gate.models import GateRun
from gate.spec import MAX_SPEC_STRING, MAX_URL_CHARS

NAN_BODY = b"[" + b",".join([b"NaN"] * 198_000) + b"]"  # 796 KB: a 29 MB answer once


@pytest.fixture
def client(app_client: TestClient) -> TestClient:
    app_client.app.state.ctx.dispatcher = Recording()  # type: ignore[attr-defined]
    return app_client


def gates_stored(client: TestClient) -> int:
    factory = client.app.state.ctx.factory  # type: ignore[attr-defined]
    with transaction(factory) as s:
        return int(s.scalar(select(func.count()).select_from(GateRun)) or 0)


def capped_problems(r: Any, status: int = 422) -> list[dict[str, str]]:
    """The problems of a bounded error answer: at most MAX_PROBLEMS named and one that counts
    the rest, the whole answer under MAX_ERROR_BYTES."""
    assert r.status_code == status, r.text[:500]
    assert len(r.content) <= MAX_ERROR_BYTES, len(r.content)
    problems: list[dict[str, str]] = r.json()["error"]["problems"]
    assert len(problems) <= MAX_PROBLEMS + 1
    return problems


@pytest.mark.parametrize(
    "path", ["/v1/no-such-path", "/v1/webhooks/ci", "/logout", "/v1/gates", "/login"]
)
def test_a_body_of_nan_gets_a_small_answer_on_any_path(client: TestClient, path: str) -> None:
    """Before routing and auth (a path that does not exist, the CI webhook before its
    signature, /logout), the first NaN are named and the rest counted."""
    started = time.monotonic()
    r = client.post(path, content=NAN_BODY, headers={"Content-Type": "application/json"})
    problems = capped_problems(r)
    assert problems[0] == {
        "path": "0",
        "message": "NaN is not a number JSON allows: give a finite number",
    }
    assert problems[-1] == {
        "path": "(request)",
        "message": f"and {198_000 - MAX_PROBLEMS} more mistakes",
    }
    assert r.json()["error"]["message"].startswith("request has mistakes: 0: NaN is not")
    assert len(r.content) < 10_000  # 29 MB before
    assert time.monotonic() - started < 30  # the parse alone; was the answer's 29 MB too
    assert gates_stored(client) == 0


def test_validation_errors_are_capped_and_counted(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """60,000 unknown fields in a body under the size limit: a 6 MB 422 before."""
    body = {f"x{i}": 0 for i in range(60_000)}
    r = client.post("/v1/gates", json=body, headers=auth(tokens["run"]))
    problems = capped_problems(r)
    assert problems[0] == {"path": "x0", "message": "Extra inputs are not permitted"}
    assert problems[-1]["message"] == f"and {60_000 - MAX_PROBLEMS} more mistakes"
    assert r.json()["error"]["code"] == "invalid_request"
    assert len(r.content) < 10_000


def test_a_spec_error_counts_all_its_mistakes(client: TestClient, tokens: dict[str, str]) -> None:
    body = {**spec_dict("many"), **{f"x{i}": 0 for i in range(5_000)}}
    r = client.post("/v1/gates", json={"spec": body}, headers=auth(tokens["run"]))
    problems = capped_problems(r)
    assert r.json()["error"]["message"].startswith("request has 5000 mistakes:")
    assert problems[-1]["message"] == f"and {5_000 - MAX_PROBLEMS} more mistakes"


def test_wide_characters_cannot_stretch_an_error_past_its_limit(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """Control characters come back as 6-byte escapes: long keys of them are cut, and the
    answer still fits its byte limit."""
    raw = json.dumps({"\u0001" * 2_000 + str(i): 0 for i in range(60)}).encode()
    assert 700_000 < len(raw) < 1_000_000  # 6 bytes a character, under the body limit
    r = client.post(
        "/v1/gates",
        content=raw,
        headers={**auth(tokens["run"]), "Content-Type": "application/json"},
    )
    problems = capped_problems(r)
    assert all(len(p["path"]) <= 120 for p in problems)
    assert len(r.content) <= MAX_ERROR_BYTES


def flagger_hook(metadata: dict[str, Any]) -> dict[str, Any]:
    return {"name": "llama", "namespace": "serving", "checksum": "c", "metadata": metadata}


def test_the_flagger_hook_checks_its_token_before_its_body(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """60,000 metadata keys that are not strings: a 7.1 MB 422 before the token was read. Now
    a caller without a run token gets a 401 (or 403) naming nothing of the body."""
    junk = {f"k{i}": i for i in range(60_000)}
    url = "/v1/webhooks/flagger/confirm-rollout"
    for metadata, status in [
        (junk, 401),  # no token at all
        ({**junk, "token": "gt_not-a-token"}, 401),
        ({**junk, "token": tokens["read"]}, 403),
    ]:
        r = client.post(url, json=flagger_hook(metadata))
        assert r.status_code == status, r.text[:300]
        assert len(r.content) < 1_000
        assert "problems" not in r.json()["error"]
    # the token in the Authorization header (a proxy's) counts too; then the body is read
    r = client.post(url, json=flagger_hook(junk), headers=auth(tokens["run"]))
    problems = capped_problems(r)
    assert problems[0] == {"path": "metadata.k0", "message": "Input should be a valid string"}
    assert problems[-1]["message"].endswith("more mistakes")
    assert len(r.content) < 10_000  # 7.1 MB before
    strings = {f"k{i}": "v" for i in range(60_000)}
    r = client.post(url, json=flagger_hook(strings), headers=auth(tokens["run"]))
    assert capped_problems(r) == [
        {
            "path": "metadata",
            "message": "Dictionary should have at most 32 items after validation, not more",
        }
    ]
    # with the token in the metadata, a valid body goes on to the hook's own checks
    r = client.post(url, json=flagger_hook({"token": tokens["run"], "spec": "missing"}))
    assert r.status_code == 422 and "no spec named 'missing'" in r.text, r.text[:300]


def test_flagger_metadata_values_are_capped(client: TestClient, tokens: dict[str, str]) -> None:
    url = "/v1/webhooks/flagger/confirm-rollout"
    md = {"token": tokens["run"], "spec": "llama", "key": "k", "candidate_image": "x" * 20_001}
    problems = capped_problems(client.post(url, json=flagger_hook(md)))
    assert problems == [
        {
            "path": "metadata.candidate_image",
            "message": "String should have at most 20000 characters",
        }
    ]
    md = {"token": tokens["run"], "spec": "llama", "k" * 65: "v"}
    problems = capped_problems(client.post(url, json=flagger_hook(md)))
    assert problems[0]["path"].startswith("metadata.kkkk")
    assert problems[0]["message"] == "String should have at most 64 characters"


# -- strings a caller stores ---------------------------------------------------------------------


@pytest.fixture
def url_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"engine_url_allow": ["127.0.0.1:9"]})


def url_spec(path_chars: int) -> dict[str, Any]:
    spec = spec_dict("urls")
    spec["reference"] = {"url": "http://127.0.0.1:9/" + "a" * path_chars}
    spec["candidate"] = {"url": "http://127.0.0.1:9/" + "b" * path_chars}
    return spec


def test_a_url_is_capped_so_gate_lists_stay_small(url_settings: Settings) -> None:
    """Three gates with 300,000-character URL paths made every gate list and `/` 1.8 MB."""
    app = create_app(url_settings)
    with TestClient(app) as client:
        app.state.ctx.dispatcher = Recording()
        from gate.access.tokens import create_token

        token = create_token(app.state.ctx.factory, "urls", ["run"])
        fits = MAX_URL_CHARS - len("http://127.0.0.1:9/")
        ok = client.post("/v1/gates", json={"spec": url_spec(fits)}, headers=auth(token))
        assert ok.status_code == 202, ok.text[:300]  # the longest URL the cap allows
        for _ in range(3):
            r = client.post("/v1/gates", json={"spec": url_spec(300_000)}, headers=auth(token))
            problems = {p["path"]: p["message"] for p in capped_problems(r)}
            assert problems == {
                "reference.url": f"String should have at most {MAX_URL_CHARS} characters",
                "candidate.url": f"String should have at most {MAX_URL_CHARS} characters",
            }
            assert len(r.content) < 2_000
        assert gates_stored(client) == 1
        listed = client.get("/v1/gates", headers=auth(token))
        assert listed.json()["total"] == 1 and len(listed.content) < 5_000
        assert len(client.get("/", headers=auth(token)).content) < 30_000


def test_every_other_spec_string_is_capped(client: TestClient, tokens: dict[str, str]) -> None:
    """Names, a region, a suite's knob key: each refused past its cap, naming the field."""
    spec = spec_dict("caps")
    spec["shape"] = {**spec["shape"], "regions": ["r" * (MAX_SPEC_STRING + 1)], "sku": "s" * 5000}
    spec["name"] = "n" * 300
    r = client.post("/v1/gates", json={"spec": spec}, headers=auth(tokens["run"]))
    problems = {p["path"]: p["message"] for p in capped_problems(r)}
    at_most = f"String should have at most {MAX_SPEC_STRING} characters"
    assert problems["shape.regions[0]"] == at_most
    assert problems["shape.sku"] == at_most
    assert "name" in problems
    spec = spec_dict("caps")
    spec["shape"] = {**spec["shape"], "regions": [f"r{i}" for i in range(257)]}
    r = client.post("/v1/gates", json={"spec": spec}, headers=auth(tokens["run"]))
    problems = {p["path"]: p["message"] for p in capped_problems(r)}
    assert problems == {
        "shape.regions": "List should have at most 256 items after validation, not 257"
    }
    assert gates_stored(client) == 0


def test_the_ci_webhooks_stored_strings_are_capped(client: TestClient) -> None:
    """The delivery id and the callback are stored with the gate: each has its cap."""
    delivery = {
        "delivery_id": "d" * 129,
        "timestamp": time.time(),
        "spec": spec_dict("ci-caps"),
        "callback": {"url": "http://127.0.0.1:9/allowed/" + "x" * 2_000, "context": "c" * 201},
    }
    body = json.dumps(delivery).encode()
    headers = {"Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET, body)}
    r = client.post("/v1/webhooks/ci", content=body, headers=headers)
    problems = {p["path"]: p["message"] for p in capped_problems(r)}
    assert problems == {
        "delivery_id": "String should have at most 128 characters",
        "callback.url": "String should have at most 2000 characters",
        "callback.context": "String should have at most 200 characters",
    }
    assert gates_stored(client) == 0


# -- one limit for every answer ------------------------------------------------------------------


def test_an_answer_over_the_limit_is_replaced_never_sent(settings: Settings) -> None:
    """GATE_MAX_ANSWER_BYTES holds every answer, whoever wrote it: the docs page (about
    110 KB) is refused under a 96 KiB limit, with a short error; smaller answers pass."""
    limited = settings.model_copy(update={"max_answer_bytes": 98_304})
    with TestClient(create_app(limited)) as client:
        r = client.get("/v1/docs")
        assert r.status_code == 500, len(r.content)
        assert r.json()["error"]["code"] == "answer_too_large"
        assert len(r.content) < 500
        assert client.get("/v1/openapi.json").status_code == 200  # about 71 KB: under it
        assert client.get("/v1/gates").status_code == 401  # a small error answer, as it was
    with TestClient(create_app(settings)) as client:
        r = client.get("/v1/docs")
        assert r.status_code == 200 and len(r.content) > 65_536


def test_the_size_limit_setting_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GATE_MAX_ANSWER_BYTES", "100000")
    monkeypatch.setenv("GATE_API_DOCS", "false")
    s = Settings(data_dir=tmp_path)
    assert (s.max_answer_bytes, s.api_docs) == (100_000, False)
