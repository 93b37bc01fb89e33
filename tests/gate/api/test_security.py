"""Each attack an ordinary `run` token could make on `gate serve` with its defaults, sent
through the real API, fails: nothing ran, nothing was written, nothing was stored; and the
honest use of the same routes still works. One test per class (issue 14)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apitools import SECRET, SIM_TEMPLATE, Recording, auth, spec_dict, write_named_spec
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings
from gate.integrations.signatures import sign
from gate.spec import parse_spec


@pytest.fixture
def recorded(settings: Settings) -> Iterator[tuple[TestClient, Recording]]:
    """The real app whose dispatcher records what it is handed and runs nothing."""
    app = create_app(settings, start_workers=False)
    recording = Recording()
    app.state.ctx.dispatcher = recording
    with TestClient(app) as client:
        yield client, recording


def _token(client: TestClient, name: str, scope: str = "run") -> str:
    return create_token(client.app.state.ctx.factory, name, [scope])  # type: ignore[attr-defined]


def _total(client: TestClient, token: str) -> int:
    return int(client.get("/v1/gates", headers=auth(token)).json()["total"])


def _paths(r: Any) -> dict[str, str]:
    assert r.status_code == 422, r.text
    return {p["path"]: p["message"] for p in r.json()["error"]["problems"]}


class Listener:
    """A TCP port that counts the connections it is made: an internal service that must never
    hear from the gate."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


# -- program execution through a preset engine -------------------------------------------------


def test_program_execution_through_a_request_is_refused(
    recorded: tuple[TestClient, Recording], settings: Settings, tmp_path: Path, tag: str
) -> None:
    client, recording = recorded
    token = _token(client, "ci")
    marker = tmp_path / "written-by-the-attacker"
    kubeconfig = tmp_path / "stolen-kubeconfig"
    attacks: list[tuple[str, dict[str, Any]]] = [
        # the reproduced one: python's warnings filter imports antigravity, which runs $BROWSER
        (
            "env",
            {
                "preset": "sim",
                "env": {"PYTHONWARNINGS": "ignore::antigravity.X", "BROWSER": f"touch {marker}"},
            },
        ),
        ("args", {"preset": "sim", "args": ["--truth-log", str(marker)]}),
        ("command", {"command": ["touch", str(marker)]}),
        # the explicit kind (gate/spec/kinds.py) is no way around the allow-list either
        ("kind", {"kind": "command", "command": ["touch", str(marker)]}),
        ("kind", {"kind": "url", "url": "http://169.254.169.254/"}),
        ("preset", {"preset": "vllm"}),
        ("cwd", {"url": "http://127.0.0.1:1", "cwd": str(tmp_path)}),
        (
            "kubernetes",
            {
                "kubernetes": {
                    "image": "vllm/vllm-openai:v0.11.0",
                    "namespace": "kube-system",
                    "args": ["--port", "{port}"],
                    "kubeconfig": str(kubeconfig),
                    "service_account": "cluster-admin",
                    "secret_env": {"T": {"secret": "other-teams-secret", "key": "token"}},
                    "image_pull_secrets": ["other-teams-pull-secret"],
                }
            },
        ),
    ]
    for field, engine in attacks:
        body = spec_dict(tag)
        body["reference"] = engine
        paths = _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
        assert f"reference.{field}" in paths, (field, paths)
        assert "GATE_ENGINES" in paths[f"reference.{field}"]  # names the setting that allows
    # a template's parameters are typed: no option, no path, no unknown parameter
    for params, path in (
        ({"tag": "--truth-log=/tmp/x"}, "candidate.params.tag"),
        ({"tag": "ok", "env": {"BROWSER": "sh"}}, "candidate.params.env"),
        ({"tag": "ok", "seed": "1 --truth-log /tmp/x"}, "candidate.params.seed"),
    ):
        body = spec_dict(tag)
        body["candidate"] = {"engine": "sim", "params": params}
        assert path in _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
    # the model name is an argv item too
    body = {**spec_dict(tag), "model": f"--truth-log={marker}"}
    assert "model" in _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
    # the inventory is the operator's: not read, not quoted back
    body = {**spec_dict(tag), "inventory": str(kubeconfig)}
    r = client.post("/v1/gates", json={"spec": body}, headers=auth(token))
    assert "GATE_INVENTORY" in _paths(r)["inventory"] and str(kubeconfig) not in r.text
    # the same engines through every other door
    write_named_spec(settings, "named", spec_dict(tag, trusted=True))
    env_attack = attacks[0][1]
    r = client.post(
        "/v1/gates:ensure",
        json={"spec_name": "named", "candidate": env_attack},
        headers=auth(token),
    )
    assert "candidate.env" in _paths(r)
    flagger = {
        "name": "llama",
        "namespace": "serving",
        "checksum": "c1",
        "metadata": {"spec": "named", "token": token, "candidate": json.dumps(env_attack)},
    }
    assert "candidate.env" in _paths(
        client.post("/v1/webhooks/flagger/confirm-rollout", json=flagger)
    )
    delivery = json.dumps(
        {
            "delivery_id": "d1",
            "timestamp": time.time(),
            "spec": {**spec_dict(tag), "reference": env_attack},
        }
    ).encode()
    r = client.post(
        "/v1/webhooks/ci",
        content=delivery,
        headers={"X-Hub-Signature-256": sign(SECRET, delivery), "Content-Type": "application/json"},
    )
    assert "reference.env" in _paths(r)
    time.sleep(0.3)
    assert not marker.exists()
    assert recording.submitted == [] and _total(client, token) == 0

    # honest use: the operator's template, filled with its parameters
    r = client.post("/v1/gates", json={"spec": spec_dict(tag)}, headers=auth(token))
    assert r.status_code == 202, r.text
    stored = client.app.state.ctx.factory  # type: ignore[attr-defined]
    from gate.service import service

    run = service.get_gate(stored, r.json()["id"])
    argv = parse_spec(run.spec).reference.argv_template()
    assert (
        argv[: len(SIM_TEMPLATE["engine"]["command"])][:3] == SIM_TEMPLATE["engine"]["command"][:3]
    )
    assert argv[argv.index("--tag") + 1] == tag and argv[argv.index("--ttft-ms") + 1] == "20.0"
    assert recording.submitted == [run.id]


# -- gate hijack through idempotency keys --------------------------------------------------


def test_gate_hijack_through_idempotency_keys_is_refused(
    recorded: tuple[TestClient, Recording], settings: Settings, tag: str
) -> None:
    import hashlib

    client, recording = recorded
    argo, attacker = _token(client, "argo"), _token(client, "attacker")
    honest = spec_dict(tag)
    evil = spec_dict(tag)
    evil["candidate"]["params"]["seed"] = 3  # the attacker's candidate, not Argo's
    # The attacker guesses every key another system could use, under the old shared namespace:
    spec_hash = store_key(parse_spec_via_api(client, honest, attacker))
    guesses = [spec_hash, hashlib.sha256(b"ci:delivery-7").hexdigest(), "deploy-42"]
    for key in guesses:
        r = client.post(
            "/v1/gates", json={"spec": evil}, headers={**auth(attacker), "Idempotency-Key": key}
        )
        assert r.status_code == 202, r.text
    planted = {g["id"] for g in client.get("/v1/gates", headers=auth(argo)).json()["gates"]}
    # Argo's ensure and a CI delivery get gates of their own, for their own spec
    mine = client.post("/v1/gates:ensure", json={"spec": honest}, headers=auth(argo)).json()
    assert mine["id"] not in planted and mine["state"] == "pending"
    delivery = json.dumps(
        {"delivery_id": "delivery-7", "timestamp": time.time(), "spec": honest}
    ).encode()
    r = client.post(
        "/v1/webhooks/ci",
        content=delivery,
        headers={"X-Hub-Signature-256": sign(SECRET, delivery), "Content-Type": "application/json"},
    )
    assert r.status_code == 202 and r.json()["gate"]["id"] not in planted
    # another token with the same Idempotency-Key gets its own gate
    r = client.post(
        "/v1/gates", json={"spec": honest}, headers={**auth(argo), "Idempotency-Key": "deploy-42"}
    )
    assert r.status_code == 202 and r.json()["id"] not in planted
    # one token's key reused for another spec is a conflict, not the old gate's verdict
    r = client.post(
        "/v1/gates", json={"spec": evil}, headers={**auth(argo), "Idempotency-Key": "deploy-42"}
    )
    assert r.status_code == 409, r.text
    # honest retries: the same token, key and spec are the same gate
    again = client.post(
        "/v1/gates", json={"spec": honest}, headers={**auth(argo), "Idempotency-Key": "deploy-42"}
    )
    assert again.status_code == 200
    assert (
        client.post("/v1/gates:ensure", json={"spec": honest}, headers=auth(argo)).json()["id"]
        == mine["id"]
    )
    # Flagger: another token's hook for the same canary revision is another gate
    write_named_spec(settings, "llama", spec_dict(tag, trusted=True))
    hook = {
        "name": "llama",
        "namespace": "serving",
        "checksum": "rev-1",
        "metadata": {"spec": "llama"},
    }
    theirs = client.post(
        "/v1/webhooks/flagger/confirm-rollout",
        json={**hook, "metadata": {**hook["metadata"], "token": attacker}},
    ).json()["id"]
    flagger = _token(client, "flagger")
    ours = client.post(
        "/v1/webhooks/flagger/confirm-rollout",
        json={**hook, "metadata": {**hook["metadata"], "token": flagger}},
    ).json()["id"]
    assert ours != theirs
    assert len(recording.submitted) == len(set(recording.submitted))


def parse_spec_via_api(client: TestClient, body: dict[str, Any], token: str) -> Any:
    """The spec as the service resolves it (what the old ensure key hashed)."""
    from gate.service.admission import resolve_spec

    settings = client.app.state.ctx.settings  # type: ignore[attr-defined]
    return resolve_spec(settings, spec=body)


def store_key(spec: Any) -> str:
    from gate.service import service

    return service.spec_key(spec)


# -- SSRF ------------------------------------------------------------------------------------


def test_ssrf_through_engine_urls_is_refused(
    recorded: tuple[TestClient, Recording], settings: Settings, listener: Listener, tag: str
) -> None:
    client, recording = recorded
    token = _token(client, "ci")
    internal = f"http://127.0.0.1:{listener.port}"
    for url, words in (
        (internal, "GATE_ENGINE_URL_ALLOW"),  # closed by default: the service's own host
        ("http://169.254.169.254/latest/meta-data", "metadata"),
        ("http://[fd00:ec2::254]", "metadata"),
        ("http://metadata.google.internal", "metadata"),
        (f"{internal}?x=/admin", "query"),
        (f"http://u:p@127.0.0.1:{listener.port}", "user info"),
        (f"{internal}/#x", "fragment"),
    ):
        body = spec_dict(tag)
        body["candidate"] = {"url": url}
        paths = _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
        assert words in paths.get("candidate.url", ""), (url, paths)
    write_named_spec(settings, "llama", spec_dict(tag, trusted=True))
    hook = {
        "name": "llama",
        "namespace": "serving",
        "checksum": "c",
        "metadata": {"spec": "llama", "token": token, "candidate_url": internal},
    }
    paths = _paths(client.post("/v1/webhooks/flagger/confirm-rollout", json=hook))
    assert "GATE_ENGINE_URL_ALLOW" in paths["candidate.url"]
    time.sleep(0.3)
    assert listener.connections == 0 and recording.submitted == []

    # honest use: the operator allows the engines' network
    app = create_app(
        settings.model_copy(update={"engine_url_allow": ["127.0.0.1"]}), start_workers=False
    )
    app.state.ctx.dispatcher = Recording()
    with TestClient(app) as allowed:
        t = create_token(app.state.ctx.factory, "ci", ["run"])
        body = spec_dict(tag)
        body["candidate"] = {"url": internal + "/"}
        r = allowed.post("/v1/gates", json={"spec": body}, headers=auth(t))
        assert r.status_code == 202, r.text
        assert r.json()["candidate"] == internal
        body["candidate"] = {"url": "http://169.254.169.254"}  # never, whatever the list says
        assert "candidate.url" in _paths(
            allowed.post("/v1/gates", json={"spec": body}, headers=auth(t))
        )


# -- unbounded work ----------------------------------------------------------------------------


class HostileEngine:
    """An OpenAI-style server that is ready at once and answers every completion with an SSE
    line that never ends (64 MiB offered): what it managed to send is recorded per request."""

    OFFER = 64 * 2**20

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.sent: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _json(self, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                if self.path.startswith("/v1/models"):
                    self._json(
                        {"object": "list", "data": [{"id": "demo-model", "object": "model"}]}
                    )
                else:
                    self._json({})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                sent, chunk = 0, b"data: " + b"A" * 65_530
                try:
                    while sent < outer.OFFER:
                        self.wfile.write(chunk)
                        sent += len(chunk)
                except OSError:
                    pass
                outer.sent.append(sent)
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_unbounded_work_is_refused_or_capped(settings: Settings, tag: str) -> None:
    """A spec that asks for unbounded judging or schedules is refused by field; an engine that
    streams an endless line costs the gate at most its cap per request, and the gate holds."""
    hostile = HostileEngine()
    app = create_app(settings.model_copy(update={"engine_url_allow": ["127.0.0.1"]}))
    try:
        with TestClient(app) as client:
            token = create_token(app.state.ctx.factory, "ci", ["run"])
            body = {**spec_dict(tag), "policy": {"bootstrap_resamples": 2_000_000}}
            paths = _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
            assert "policy.bootstrap_resamples" in paths
            body = {**spec_dict(tag), "scenarios": [{"suite": "normal", "requests": 10**7}]}
            paths = _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
            assert any(p.startswith("scenarios[0]") for p in paths), paths
            assert _total(client, token) == 0

            body = spec_dict(tag, requests=12, rate=20)
            body["candidate"] = {"url": hostile.url}
            created = client.post("/v1/gates", json={"spec": body}, headers=auth(token))
            assert created.status_code == 202, created.text
            from apitools import poll_finished

            done = poll_finished(client, created.json()["id"], token, timeout=120)
            assert done["verdict"] == "hold", done
            doc = client.get(f"/v1/gates/{done['id']}/document", headers=auth(token)).json()
    finally:
        hostile.close()
    assert hostile.sent, "the hostile engine was never called"
    # the gate stopped reading each endless line at its cap (1 MiB), well before the offer
    # (kernel socket buffers on loopback account for the rest)
    assert max(hostile.sent) < HostileEngine.OFFER // 4, hostile.sent
    # Every candidate request failed, but 4 judged requests cannot show a rate above the
    # ceiling with confidence (issue 17: the ceiling is judged; judge v3 weighs it on time
    # blocks, and one block of errors is one episode): the errors check says so undecided,
    # and the gate holds because the candidate's latency cannot be compared.
    errors = next(c for c in doc["checks"] if c["id"].endswith(".errors"))
    assert errors["decision"] == "undecided", errors
    assert "100.00% is above the 1.00% ceiling but not with confidence" in errors["message"]
    assert any(r["check"] == "steady.ttft.p50" for r in doc["reasons"]), doc["reasons"]
    assert "MAX_SSE" in json.dumps(doc) or "protocol" in json.dumps(doc)


def test_a_gate_is_cancelled_only_by_its_owner_or_an_admin(
    recorded: tuple[TestClient, Recording], tag: str
) -> None:
    """Another token holding `run` cannot hold Argo's rollout by cancelling its gate."""
    client, _ = recorded
    argo, ci, admin = (
        _token(client, "argo"),
        _token(client, "ci-job"),
        _token(client, "ops", "admin"),
    )
    first = client.post("/v1/gates:ensure", json={"spec": spec_dict(tag)}, headers=auth(argo))
    gid = first.json()["id"]
    r = client.post(f"/v1/gates/{gid}:cancel", headers=auth(ci))
    assert r.status_code == 403 and "another token" in r.json()["error"]["message"]
    again = client.post("/v1/gates:ensure", json={"spec": spec_dict(tag)}, headers=auth(argo))
    assert again.json()["state"] == "pending" and again.json()["verdict"] is None
    assert client.post(f"/v1/gates/{gid}:cancel", headers=auth(argo)).status_code == 202
    other = client.post("/v1/gates", json={"spec": spec_dict(tag)}, headers=auth(ci)).json()["id"]
    assert client.post(f"/v1/gates/{other}:cancel", headers=auth(admin)).status_code == 202
    delivery = json.dumps({"delivery_id": "d-9", "timestamp": time.time(), "spec": spec_dict(tag)})
    body = delivery.encode()
    r = client.post(
        "/v1/webhooks/ci",
        content=body,
        headers={"X-Hub-Signature-256": sign(SECRET, body), "Content-Type": "application/json"},
    )
    ci_gate = r.json()["gate"]["id"]
    assert client.post(f"/v1/gates/{ci_gate}:cancel", headers=auth(ci)).status_code == 403
    assert client.post(f"/v1/gates/{ci_gate}:cancel", headers=auth(admin)).status_code == 202


def test_rejudges_run_few_at_once(recorded: tuple[TestClient, Recording]) -> None:
    """A re-judge is a whole judge on request: past the few the service runs at once, a caller
    is told to come back (429), it does not queue work in the shared thread pool."""
    from gate.api import gates

    client, _ = recorded
    token = _token(client, "ci")
    held = [gates._REJUDGES.acquire(blocking=False) for _ in range(gates.REJUDGE_CONCURRENCY)]
    try:
        assert all(held)  # stands for re-judges in flight
        r = client.post("/v1/gates/whatever:rejudge", json={"policy": {}}, headers=auth(token))
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_busy"
    finally:
        for _ in held:
            gates._REJUDGES.release()
    r = client.post("/v1/gates/whatever:rejudge", json={"policy": {}}, headers=auth(token))
    assert r.status_code == 404  # a free slot: the request is served (no such gate)


def test_a_spec_of_many_mistakes_gets_a_small_answer(
    recorded: tuple[TestClient, Recording], settings: Settings, tag: str
) -> None:
    """75,000 unknown fields in a body under the size limit once took minutes and answered
    16 MB; the first mistakes are named and the rest counted."""
    client, recording = recorded
    token = _token(client, "ci")
    body = {**spec_dict(tag), **{f"x{i}": 0 for i in range(30_000)}}
    r = client.post("/v1/gates", json={"spec": body}, headers=auth(token))
    problems = _paths(r)
    assert len(problems) <= 51 and len(r.content) < 20_000
    assert any("more mistakes" in m for m in problems.values())
    params = {f"p{i}": 1 for i in range(30_000)}
    body = spec_dict(tag)
    body["candidate"] = {"engine": "sim", "params": {**params, "tag": "ok"}}
    r = client.post("/v1/gates", json={"spec": body}, headers=auth(token))
    assert len(_paths(r)) <= 51 and len(r.content) < 20_000
    # a hostile JSON string where Flagger carries an engine: refused, never a 500
    write_named_spec(settings, "llama", spec_dict(tag, trusted=True))
    for text in ("[" * 50_000, '{"engine": "sim", "params": {"tag": NaN}}', "1" * 5000, "[]"):
        hook = {
            "name": "llama",
            "namespace": "serving",
            "checksum": "c",
            "metadata": {"spec": "llama", "token": token, "candidate": text},
        }
        r = client.post("/v1/webhooks/flagger/confirm-rollout", json=hook)
        assert "metadata.candidate" in _paths(r), text[:20]
    # values Kubernetes or a second substitution would read again
    for model in ("$(HF_TOKEN)", "/root/.ssh/id_rsa", "../../etc/passwd", "-x"):
        body = {**spec_dict(tag), "model": model}
        assert "model" in _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
    for value in ("{model}", "$(HF_TOKEN)", "a..b"):
        body = spec_dict(tag)
        body["candidate"] = {"engine": "sim", "params": {"tag": value}}
        paths = _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
        assert "candidate.params.tag" in paths, value
    assert recording.submitted == []


# -- web session -------------------------------------------------------------------------------


def test_web_session_attacks_are_refused(
    recorded: tuple[TestClient, Recording], settings: Settings, tag: str
) -> None:
    """The three reproduced: the sign-in cookie was the raw token with all its scopes and
    passed any POST; /metrics needed no token; a signed CI body with a NaN timestamp passed
    the replay window. (Each in depth: tests/gate/web/test_sessions.py, test_nonfinite.py.)"""
    client, recording = recorded
    token = _token(client, "dev", "admin")
    ours = {"Origin": "http://gate.test"}  # the fixture's GATE_PUBLIC_URL
    r = client.post(
        "/login",
        data={"token": token, "next": "/", "allow_run": "1"},
        headers=ours,
        follow_redirects=False,
    )
    assert r.status_code == 303
    cookie = client.cookies["gate_session"]
    assert token not in cookie and token not in r.headers["set-cookie"]
    # a cross-site POST riding the cookie: no CSRF token, a foreign Origin
    for headers in ({}, {"Origin": "https://evil.example"}, ours):
        r = client.post("/v1/gates", json={"spec": spec_dict(tag)}, headers=headers)
        assert r.status_code == 403, (headers, r.text)
    page = client.get("/").text
    csrf = page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    r = client.post(
        "/v1/gates", json={"spec": spec_dict(tag)}, headers={**ours, "X-CSRF-Token": csrf}
    )
    assert r.status_code == 202  # the honest page request, with its token
    client.cookies.clear()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=auth(token)).status_code == 200
    body = b'{"delivery_id": "d-nan", "timestamp": NaN, "spec_name": "x"}'
    r = client.post(
        "/v1/webhooks/ci",
        content=body,
        headers={"X-Hub-Signature-256": sign(SECRET, body), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and "timestamp" in r.text
    assert len(recording.submitted) == 1  # only the honest one


def test_one_token_cannot_take_every_gate(settings: Settings, tag: str) -> None:
    """Past its share of active gates a token is told to wait (429); another token is not
    affected, and polling an existing gate is never refused."""
    app = create_app(
        settings.model_copy(update={"max_active_gates_per_token": 2}), start_workers=False
    )
    app.state.ctx.dispatcher = Recording()
    with TestClient(app) as client:
        greedy = create_token(app.state.ctx.factory, "greedy", ["run"])
        other = create_token(app.state.ctx.factory, "other", ["run"])
        ids = []
        for seed in (1, 2):
            body = spec_dict(tag)
            body["candidate"]["params"]["seed"] = seed + 10
            ids.append(client.post("/v1/gates", json={"spec": body}, headers=auth(greedy)).json())
        body = spec_dict(tag)
        body["candidate"]["params"]["seed"] = 99
        r = client.post("/v1/gates", json={"spec": body}, headers=auth(greedy))
        assert r.status_code == 429 and "GATE_MAX_ACTIVE_GATES_PER_TOKEN" in r.text
        assert client.post("/v1/gates", json={"spec": body}, headers=auth(other)).status_code == 202
        assert (
            client.post(f"/v1/gates/{ids[0]['id']}:cancel", headers=auth(greedy)).status_code == 202
        )
        assert (
            client.post("/v1/gates", json={"spec": body}, headers=auth(greedy)).status_code == 202
        )


def test_assembled_template_values_and_odd_inputs_are_refused(
    recorded: tuple[TestClient, Recording], tag: str
) -> None:
    client, recording = recorded
    token = _token(client, "ci")
    for model in ("home/ubuntu/models/unreleased-70b", "s3://bucket/m", "gs://b/m"):
        body = {**spec_dict(tag), "model": model}
        assert "model" in _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))
    body = spec_dict(tag)
    body["candidate"] = {"engine": "sim", "params": {"tag": "ok", "ttft_ms": 10**400}}
    assert "candidate.params.ttft_ms" in _paths(
        client.post("/v1/gates", json={"spec": body}, headers=auth(token))
    )
    assert recording.submitted == []


def test_a_callers_url_is_held_to_the_allow_list_again_when_it_attaches(
    settings: Settings, listener: Listener, tag: str
) -> None:
    """Accepted while its host was allowed, refused at attach once the operator's list no
    longer admits it (or its name points elsewhere): the gate holds naming the allow-list,
    and the address hears nothing."""
    import asyncio

    from gate.runs.runner import run_gate
    from gate.service import service

    allowed = settings.model_copy(update={"engine_url_allow": ["127.0.0.1"]})
    app = create_app(allowed, start_workers=False)
    app.state.ctx.dispatcher = Recording()
    with TestClient(app) as client:
        token = create_token(app.state.ctx.factory, "ci", ["run"])
        body = spec_dict(tag)
        body["reference"] = {"url": f"http://127.0.0.1:{listener.port}"}
        body["candidate"] = {"url": f"http://127.0.0.1:{listener.port}"}
        r = client.post("/v1/gates", json={"spec": body}, headers=auth(token))
        assert r.status_code == 202, r.text
        run = service.get_gate(app.state.ctx.factory, r.json()["id"])
    spec = parse_spec(run.spec)
    assert spec.reference.caller_url and spec.candidate.caller_url
    # the worker runs it under the operator's settings of now: the host is no longer allowed
    outcome = asyncio.run(run_gate(spec, settings, gate_id=run.id))
    assert outcome.verdict == "hold"
    assert "GATE_ENGINE_URL_ALLOW" in json.dumps(outcome.document)
    assert listener.connections == 0
    # an operator's named spec with the same URL is trusted as written (no caller_url)
    assert not parse_spec(spec_dict(tag, trusted=True)).reference.caller_url


def test_workload_files_come_only_from_the_operators_directory(
    recorded: tuple[TestClient, Recording], settings: Settings, tmp_path: Path, tag: str
) -> None:
    """A caller's spec names a workload file; the service reads it only from
    GATE_WORKLOAD_DIR, with every link followed: without that setting no file is read, a name
    that climbs out (`..`, an absolute path) is refused by the spec, a link inside that leads
    out is refused without reading it, and a file's own mistake names the scenario field,
    the file as written, its line and field, never the directory or the record's text.
    Nothing is queued (docs/security.md)."""
    client, recording = recorded
    token = create_token(client.app.state.ctx.factory, "ci", ["run"])  # type: ignore[attr-defined]
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n')

    def refused(file: str) -> dict[str, str]:
        body = spec_dict(tag)
        body["scenarios"] = [{"name": "replay", "workload": {"kind": "trace", "file": file}}]
        return _paths(client.post("/v1/gates", json={"spec": body}, headers=auth(token)))

    paths = refused("traces/prod.jsonl")  # no GATE_WORKLOAD_DIR: nothing is read
    assert "GATE_WORKLOAD_DIR" in paths["scenarios[0].workload.file"], paths
    for hostile in ("../secret.jsonl", str(secret), "a/../../secret.jsonl"):
        paths = refused(hostile)
        assert (
            "relative to the operator's workload directory" in paths["scenarios[0].workload.file"]
        ), paths

    workloads = tmp_path / "workloads"
    workloads.mkdir()
    (workloads / "escape.jsonl").symlink_to(secret)
    (workloads / "bad.jsonl").write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
        '{"timestamp": 9, "input_length": "SECRET-TEXT", "output_length": 1}\n'
    )
    client.app.state.ctx.settings = settings.model_copy(update={"workload_dir": workloads})  # type: ignore[attr-defined]
    paths = refused("escape.jsonl")
    assert paths == {
        "scenarios[0].workload.file": "escape.jsonl leads outside the operator's workload directory"
    }
    paths = refused("bad.jsonl")
    message = paths["scenarios[0].workload.file"]
    assert message == "bad.jsonl line 2: input_length: must be an integer, got str"
    assert str(workloads) not in json.dumps(paths) and "SECRET" not in json.dumps(paths)
    assert recording.submitted == []
