"""Verdict alerts through the real API: a sim gate ends and a real HTTP receiver on this host
gets a Slack-compatible message and generic JSON alerts; a 500 is retried (at once, then by a
reaper pass), a hold-only target does not hear a continue, and every delivery is recorded
(`GET /v1/gates/{id}/alerts`). Slack's message format: docs.slack.dev/messaging/
sending-messages-using-incoming-webhooks (`text` + `blocks`), text objects of type `mrkdwn`
with 1 to 3,000 characters (docs.slack.dev/reference/block-kit/composition-objects/
text-object), links `<url|label>` (docs.slack.dev/messaging/formatting-message-text)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from apitools import SECRET, SIM_TEMPLATE, auth, poll_finished, spec_dict, wait_for
from fastapi.testclient import TestClient

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.clock import now
from gate.core.settings import AlertTarget, Settings
from gate.integrations import signatures
from gate.service.alerts import alerts_due

pytestmark = pytest.mark.slow

ALERT_SECRET = "alert-secret"


class Receiver:
    """A webhook receiver: records each POST; `script[path]` lists the statuses it answers
    in turn (the last one repeats)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], bytes]] = []
        self.script: dict[str, list[int]] = {}
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                me.got.append((self.path, dict(self.headers), body))
                statuses = me.script.get(self.path, [200])
                status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for p, h, b in self.got if p == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture
def alerting(tmp_path: Path, receiver: Receiver) -> Iterator[tuple[TestClient, Settings]]:
    hooks = f"{receiver.base}/hooks/"
    settings = Settings(
        data_dir=tmp_path / ".gate",
        heartbeat_s=0.5,
        lost_after_s=10,
        public_url="http://gate.test",
        webhook_secret=SECRET,
        engines={"sim": SIM_TEMPLATE},
        alert_targets=[
            AlertTarget(name="team", url=f"{hooks}slack", format="slack", on="all"),
            AlertTarget(name="oncall", url=f"{hooks}flaky", on="all", every_gate=False),
        ],
        alert_allow=[hooks],
        alert_secret=ALERT_SECRET,
    )
    with TestClient(create_app(settings)) as c:
        yield c, settings


def test_alerts_reach_a_real_receiver_slack_and_json_retried_and_recorded(
    alerting: tuple[TestClient, Settings], receiver: Receiver, tag: str
) -> None:
    client, settings = alerting
    factory = client.app.state.ctx.factory  # type: ignore[attr-defined]
    run, read = (auth(create_token(factory, f"t-{s}", [s])) for s in ("run", "read"))
    receiver.script = {"/hooks/flaky": [500, 200], "/hooks/down": [500, 500, 500, 200]}
    spec = spec_dict(tag, requests=40) | {"correctness": "off"}  # short: the alerts matter
    spec["notify"] = [
        {"target": "oncall", "on": "all"},
        {"url": f"{receiver.base}/hooks/down", "on": "all"},
        {"url": f"{receiver.base}/hooks/holds-only"},  # on: hold, the default
    ]
    r = client.post("/v1/gates", json={"spec": spec}, headers=run)
    assert r.status_code == 202, r.text
    gid = r.json()["id"]
    final = poll_finished(client, gid, read["Authorization"].split()[1])
    verdict = final["verdict"]
    report = f"http://gate.test/gates/{gid}"

    def recorded() -> dict[str, Any]:
        got = client.get(f"/v1/gates/{gid}/alerts", headers=read).json()
        return {a["target"]: a for a in got}

    # the finisher's pass: the last target tried has made its three posts
    wait_for(lambda: recorded()["notify[1]"]["posts"] == 3, what="the first alert pass")
    # Slack's incoming-webhook shape: text (the notification) and blocks, the report linked
    ((_, slack),) = receiver.bodies("/hooks/slack")
    message = json.loads(slack)
    assert message["text"].startswith(f"{verdict.upper()}: gate api-test ({gid}): ")
    assert report in message["text"]
    assert message["blocks"][0]["type"] == "section"
    assert message["blocks"][0]["text"]["type"] == "mrkdwn"
    assert all(0 < len(b["text"]["text"]) <= 3000 for b in message["blocks"] if "text" in b)
    assert message["blocks"][-1]["elements"][0]["text"] == f"<{report}|the gate's report>"
    # the generic JSON alert, signed: the verdict summary every surface shows; a 500, then sent
    (first, _), (headers, body) = receiver.bodies("/hooks/flaky")
    assert first["X-Hub-Signature-256"] == headers["X-Hub-Signature-256"]  # the same body
    assert signatures.verify(ALERT_SECRET, body, headers["X-Hub-Signature-256"])
    alert = json.loads(body)
    assert alert["event"] == "gate.finished" and alert["name"] == "api-test"
    assert alert["verdict"]["id"] == gid and alert["verdict"]["verdict"] == verdict
    assert alert["verdict"]["summary"] == final["summary"]
    assert alert["verdict"]["report_url"] == report
    assert alert["candidate"] == final["candidate"]
    # the holds-only URL heard nothing of a continue; a hold reaches it
    assert receiver.bodies("/hooks/holds-only") == [] or verdict == "hold"

    seen = recorded()
    assert seen["team"] | {"tried_at": None, "sent_at": None} == {
        "target": "team", "format": "slack", "on": "all", "attempts": 1, "posts": 1,
        "last_status": 200, "sent": True, "done": True, "result": "sent: HTTP 200 (try 1)",
        "tried_at": None, "sent_at": None,
    }  # fmt: skip
    assert (seen["oncall"]["posts"], seen["oncall"]["sent"]) == (2, True)
    assert seen["oncall"]["result"] == "sent: HTTP 200 (try 2)"
    down = seen["notify[1]"]
    assert (down["posts"], down["last_status"]) == (3, 500)
    assert (down["sent"], down["done"]) == (False, False)
    if verdict == "continue":
        assert seen["notify[2]"]["done"] and seen["notify[2]"]["posts"] == 0
        assert "not owed" in seen["notify[2]"]["result"]
    # a reaper pass retries what is owed once it is due (30 s after the first attempt)
    assert alerts_due(factory, settings) == 0
    assert alerts_due(factory, settings, at=now() + timedelta(seconds=31)) == 1
    down = recorded()["notify[1]"]
    assert (down["attempts"], down["posts"], down["last_status"], down["sent"]) == (2, 4, 200, True)
    assert len(receiver.bodies("/hooks/down")) == 4


def test_a_callers_alert_targets_are_the_operators_only(
    alerting: tuple[TestClient, Settings], receiver: Receiver, tag: str
) -> None:
    client, _ = alerting
    factory = client.app.state.ctx.factory  # type: ignore[attr-defined]
    run = auth(create_token(factory, "t-run", ["run"]))
    spec = spec_dict(tag)
    spec["notify"] = [
        {"target": "nobody"},
        {"url": "http://127.0.0.1:9/elsewhere", "format": "slack"},
        {"url": "http://169.254.169.254/latest"},
        {"target": "team", "url": f"{receiver.base}/hooks/x"},
    ]
    r = client.post("/v1/gates", json={"spec": spec}, headers=run)
    assert r.status_code == 422, r.text
    problems = {p["path"]: p["message"] for p in r.json()["error"]["problems"]}
    assert "never called" in problems["notify[2]"], problems
    assert "exactly one of" in problems["notify[3]"]
    # the model's mistakes first; the operator's rules once the spec parses
    spec["notify"] = spec["notify"][:2]
    r = client.post("/v1/gates", json={"spec": spec}, headers=run)
    problems = {p["path"]: p["message"] for p in r.json()["error"]["problems"]}
    assert "no alert target 'nobody'" in problems["notify[0].target"], problems
    assert "oncall, team" in problems["notify[0].target"]
    assert "GATE_ALERT_ALLOW" in problems["notify[1].url"]
    assert receiver.got == []
