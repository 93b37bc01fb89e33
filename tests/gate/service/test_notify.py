"""Commit-status callbacks are owed until sent: whoever ends a gate tries, reapers retry;
refusals are final, attempts are bounded and claimed once. A real HTTP receiver, real SQLite."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from receiver import Receiver
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gate.core import clock
from gate.core.database import transaction
from gate.core.settings import Settings
from gate.integrations.callbacks import allowed, provider, status_body
from gate.models import GateRun
from gate.service import service
from gate.service.notify import notify, notify_due
from gate.service.reaper import Reaper
from gate.service.schemas import VerdictSummary
from gate.spec import GateSpec, parse_spec


def small_spec(name: str = "cb") -> GateSpec:
    return parse_spec(
        {
            "name": name,
            "model": "m",
            "reference": {"preset": "sim"},
            "candidate": {"preset": "sim"},
            "scenarios": [{"name": "a", "rate": 5, "requests": 10}],
        }
    )


def settings_for(tmp_path: Path, receiver: Receiver) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        callback_allow=[f"{receiver.url}/repos/acme/", f"{receiver.url}/api/v4/projects/"],
        public_url="http://gate.test",
    )


def cancelled_gate(factory: sessionmaker[Session], url: str | None, name: str = "cb") -> str:
    """A gate with (or without) a callback, ended: cancelled before it started."""
    callback = None if url is None else {"url": url, "context": "llm-deploy-gate"}
    run, _ = service.create_gate(factory, small_spec(name), source="ci", callback=callback)
    service.request_cancel(factory, run.id, "cancelled by the test", admin=True)
    return run.id


def age_last_try(factory: sessionmaker[Session], gate_id: str, seconds: float) -> None:
    with transaction(factory) as s:
        s.execute(
            update(GateRun)
            .where(GateRun.id == gate_id)
            .values(callback_tried_at=clock.now() - timedelta(seconds=seconds))
        )


def test_a_finished_gate_callback_is_sent_once(
    tmp_path: Path, factory: sessionmaker[Session], receiver: Receiver
) -> None:
    settings = settings_for(tmp_path, receiver)
    gid = cancelled_gate(factory, f"{receiver.url}/repos/acme/llm/statuses/abc")
    assert service.due_callbacks(factory) == [gid]
    assert notify(factory, gid, settings) is True
    assert notify(factory, gid, settings) is None  # not owed any more
    assert service.due_callbacks(factory) == []
    assert len(receiver.calls) == 1
    _, body = receiver.calls[0]
    assert body["state"] == "failure" and body["context"] == "llm-deploy-gate"
    assert body["description"].startswith("hold: cancelled by the test")
    run = service.get_gate(factory, gid)
    assert run.callback_sent_at is not None and run.callback_attempts == 1
    assert run.callback_result == "sent: HTTP 201"


def test_gates_without_a_callback_are_never_due(
    tmp_path: Path, factory: sessionmaker[Session]
) -> None:
    cancelled_gate(factory, None)
    assert service.due_callbacks(factory) == []
    with transaction(factory) as s:  # stored as SQL NULL, not JSON null
        assert s.scalars(GateRun.__table__.select().where(GateRun.callback.is_(None))).all()


def test_a_failing_receiver_is_retried_with_spacing_then_given_up(
    tmp_path: Path, factory: sessionmaker[Session]
) -> None:
    failing = Receiver(answers=(503,))
    try:
        settings = settings_for(tmp_path, failing)
        gid = cancelled_gate(factory, f"{failing.url}/repos/acme/llm/statuses/abc")
        assert notify(factory, gid, settings) is False
        assert len(failing.calls) == 3  # quick retries inside one attempt
        assert service.due_callbacks(factory) == []  # not due again yet: 30 s spacing
        assert notify(factory, gid, settings) is None
        for attempt in range(2, service.CALLBACK_ATTEMPTS + 1):
            age_last_try(factory, gid, service.CALLBACK_RETRY_S * attempt)
            assert service.due_callbacks(factory) == [gid]
            assert notify_due(factory, settings) == []
        run = service.get_gate(factory, gid)
        assert run.callback_attempts == service.CALLBACK_ATTEMPTS
        assert run.callback_sent_at is None and run.callback_result == "failed: HTTP 503"
        age_last_try(factory, gid, 3600)
        assert service.due_callbacks(factory) == []  # out of attempts
        assert len(failing.calls) == 3 * service.CALLBACK_ATTEMPTS
    finally:
        failing.close()


def test_a_receiver_that_recovers_gets_the_status(
    tmp_path: Path, factory: sessionmaker[Session]
) -> None:
    flaky = Receiver(answers=(502, 502, 502, 201))
    try:
        settings = settings_for(tmp_path, flaky)
        gid = cancelled_gate(factory, f"{flaky.url}/repos/acme/llm/statuses/abc")
        assert notify(factory, gid, settings) is False
        age_last_try(factory, gid, service.CALLBACK_RETRY_S)
        assert notify_due(factory, settings) == [gid]
        assert service.get_gate(factory, gid).callback_attempts == 2
        assert service.due_callbacks(factory) == []
    finally:
        flaky.close()


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_a_refusal_is_final(tmp_path: Path, factory: sessionmaker[Session], status: int) -> None:
    refusing = Receiver(answers=(status,))
    try:
        settings = settings_for(tmp_path, refusing)
        gid = cancelled_gate(factory, f"{refusing.url}/repos/acme/llm/statuses/abc")
        assert notify(factory, gid, settings) is False
        assert len(refusing.calls) == 1
        age_last_try(factory, gid, 3600)
        assert service.due_callbacks(factory) == []
        assert service.get_gate(factory, gid).callback_result == f"refused: HTTP {status}"
    finally:
        refusing.close()


def test_a_url_taken_off_the_allow_list_is_not_sent(
    tmp_path: Path, factory: sessionmaker[Session], receiver: Receiver
) -> None:
    gid = cancelled_gate(factory, f"{receiver.url}/repos/acme/llm/statuses/abc")
    tightened = settings_for(tmp_path, receiver).model_copy(update={"callback_allow": []})
    assert notify(factory, gid, tightened) is False
    assert receiver.calls == []
    assert service.due_callbacks(factory) == []
    assert "allow-list" in (service.get_gate(factory, gid).callback_result or "")


def test_two_processes_never_make_the_same_attempt(
    tmp_path: Path, factory: sessionmaker[Session], receiver: Receiver
) -> None:
    gid = cancelled_gate(factory, f"{receiver.url}/repos/acme/llm/statuses/abc")
    got: list[Any] = []
    barrier = threading.Barrier(8)

    def claim() -> None:
        barrier.wait()
        got.append(service.claim_callback(factory, gid))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is not None for r in got) == 1
    assert service.get_gate(factory, gid).callback_attempts == 1


def test_the_reaper_delivers_what_nobody_sent(
    tmp_path: Path, factory: sessionmaker[Session], receiver: Receiver
) -> None:
    """A gate cancelled while pending (no worker ever ran it) still gets its status."""
    settings = settings_for(tmp_path, receiver)
    gid = cancelled_gate(factory, f"{receiver.url}/api/v4/projects/7/statuses/abc")
    Reaper(settings, factory).once()
    assert len(receiver.calls) == 1
    assert receiver.paths == ["/api/v4/projects/7/statuses/abc"]
    _, body = receiver.calls[0]
    # GitLab's commit-status API: `failed` (it has no `failure` or `error`) and `name`
    assert body["state"] == "failed" and body["name"] == "llm-deploy-gate"
    assert "context" not in body
    assert service.get_gate(factory, gid).callback_sent_at is not None


@pytest.mark.parametrize(
    ("verdict", "github", "gitlab"),
    [("continue", "success", "success"), ("hold", "failure", "failed"), (None, "error", "failed")],
)
def test_status_bodies_per_provider(verdict: str | None, github: str, gitlab: str) -> None:
    summary = VerdictSummary(
        id="g",
        state="error",
        verdict=verdict,  # type: ignore[arg-type]
        reason="r" * 300,
        summary=None,
        warnings=[],
        warnings_omitted=0,
        not_shown=[],
        not_shown_omitted=0,
        report_url="u",
    )
    gh = status_body(summary, "ctx", provider("https://api.github.com/repos/a/b/statuses/s"))
    gl = status_body(
        summary, "ctx", provider("https://gitlab.example/api/v4/projects/1/statuses/s")
    )
    assert gh["state"] == github and gh["context"] == "ctx"
    # without the summary line (a hand-made answer), the reason says a hold, within 140
    if verdict == "continue":
        assert gh["description"] == gl["description"] == "continue"
    else:
        assert len(gh["description"]) == 140 and gh["description"].startswith("hold: rrr")
    assert gl["state"] == gitlab and gl["name"] == "ctx" and gl["target_url"] == "u"


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://api.github.com/repos/acme/llm/statuses/x", True),
        ("https://api.github.com/repos/acme", True),
        ("https://api.github.com/repos/acme-evil/llm/statuses/x", False),
        ("https://api.github.com/repos/acmeevil", False),
        ("https://api.github.com.evil.example/repos/acme/x", False),
        ("http://api.github.com/repos/acme/x", False),
        ("https://user:pw@api.github.com/repos/acme/x", False),
        ("https://api.github.com/repos/acme/../other/x", False),
        ("https://api.github.com/repos/acme/%2e%2e/other", False),
        ("https://gitlab.example/api/v4/projects/12/statuses/s", True),
        ("https://gitlab.example/api/v4/projects-evil/12", False),
    ],
)
def test_the_allow_list_matches_whole_path_segments(url: str, ok: bool) -> None:
    allow = ["https://api.github.com/repos/acme", "https://gitlab.example/api/v4/projects/"]
    assert allowed(url, allow) is ok
