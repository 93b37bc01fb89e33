"""The fault suite for the broker: a private, real Redis (its own port, so stopping it touches
no other test) under a real `gate worker`, real PostgreSQL and a real commit-status receiver.
Redis is stopped mid-gate, without persistence (what a restart without its AOF loses: the queue
and the unacknowledged message), and a gate is requested while it is down."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from apitools import SIM_TEMPLATE, auth, spec_dict
from fastapi.testclient import TestClient
from faults import fault_row, gpus_cell
from receiver import Receiver
from sqlalchemy.orm import Session, sessionmaker
from workertools import active_leases, create, finished, gate_spec, measuring, submit, wait_gate

from gate.access.tokens import create_token
from gate.api.app import create_app
from gate.core.settings import Settings
from gate.service import service

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is part of the test services"
        self.binary = binary
        self.port = _free_port()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        subprocess.run(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self._wait(up=True)

    def stop(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
            conn.sendall(b"SHUTDOWN NOSAVE\r\n")
        self._wait(up=False)

    def _wait(self, *, up: bool) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    if up:
                        return
            except OSError:
                if not up:
                    return
            time.sleep(0.05)
        raise AssertionError(f"redis on {self.port} did not come {'up' if up else 'down'}")


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    r = PrivateRedis()
    r.start()
    yield r
    with contextlib.suppress(OSError):  # stopped already
        r.stop()


@pytest.fixture
def redis_url(private_redis: PrivateRedis) -> str:
    """This module's broker: the private server, not the shared one."""
    return private_redis.url


@pytest.fixture
def requeue_after_s() -> float:
    return 2.0


def _calls_settle(receiver: Receiver, n: int, timeout_s: float = 30.0) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while len(receiver.calls) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # and no more than that
    return list(receiver.calls)


def test_a_redis_outage_mid_gate_and_a_request_during_it_lose_nothing(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: Callable[..., Any],
    find_processes: Callable[..., list[int]],
    tag: str,
    receiver: Receiver,
    private_redis: PrivateRedis,
) -> None:
    worker = start_worker()
    status_url = f"{receiver.url}/repos/acme/llm/statuses/abc123"
    running = create(factory, gate_spec(tag, requests=600, rate=40), {"url": status_url})
    submit(settings, running)
    wait_gate(factory, running, measuring, timeout=90)

    private_redis.stop()  # no AOF, no snapshot: the queue and the unacked message are gone
    app = create_app(settings.model_copy(update={"engines": {"sim": SIM_TEMPLATE}}))
    with TestClient(app) as client:
        token = create_token(app.state.ctx.factory, "ci", ["run"])
        r = client.post("/v1/gates", json={"spec": spec_dict(tag)}, headers=auth(token))
    assert r.status_code == 202, r.text  # stored, so answered with its id: never a 500
    requested = r.json()["id"]
    time.sleep(6.0)
    private_redis.start()

    first = wait_gate(factory, running, finished, timeout=180)
    assert first.state == "complete", first.reason  # it ran on through the outage
    assert first.attempts == 1
    # The gate requested while the broker was down is queued by the worker's reaper once
    # the broker is back (GATE_REQUEUE_AFTER_S) and runs.
    second = wait_gate(factory, requested, finished, timeout=180)
    assert second.state == "complete", second.reason
    calls = _calls_settle(receiver, 1)
    assert len(calls) == 1, calls  # the running gate's commit status, once
    assert calls[0][1]["state"] in ("success", "failure")
    assert active_leases(factory) == 0
    assert service.get_gate(factory, running).attempts == 1
    assert worker.stop() == 0
    assert find_processes(tag) == []
    left = find_processes(tag, keepers=True)
    fault_row(
        fault="Redis down 6 s mid-gate without persistence (queue and unacked message "
        "lost); a POST during it",
        operator_sees=f"POST during the outage: {r.status_code} with the gate's id; commit "
        f"status {calls[0][1]['state']}: {calls[0][1]['description']}",
        final_state=f"running gate {first.state}, {first.verdict} (attempts "
        f"{service.get_gate(factory, running).attempts}); the gate requested during it "
        f"{second.state}, {second.verdict}, queued again by a reaper",
        gpus=gpus_cell(active_leases(factory)),
        orphans=len(left),
        lost=abs(1 - len(calls))
        + sum(g.state not in ("complete", "error") for g in (first, second)),
    )
    print(
        "\nFAULT redis down 6 s mid-gate, no AOF: running gate complete (attempts 1), "
        "callback sent once; a POST during the outage answered 202 and ran after it"
    )
