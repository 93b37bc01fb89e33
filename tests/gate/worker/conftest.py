"""Real parts for the worker tests: a Redis database of its own per test, a migrated
PostgreSQL database per test, and real `gate worker` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from receiver import Receiver
from services import service_missing
from sqlalchemy.orm import Session, sessionmaker
from workertools import stop_process

from gate.core.settings import Settings
from gate.service.execution import open_factory

REDIS_URL = os.environ.get("GATE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
HEARTBEAT_S = 0.5
VISIBILITY_TIMEOUT_S = 4.0
READY_TIMEOUT_S = 60.0


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis URL on a logical database nobody else uses now (empty when picked), emptied
    afterwards: the queue, the unacked index and Celery's keys are this test's alone."""
    from urllib.parse import urlsplit

    import redis

    base = urlsplit(REDIS_URL)._replace(path="").geturl()  # the server; the test picks a db
    admin = redis.Redis.from_url(base, socket_connect_timeout=2)
    try:
        admin.ping()
    except Exception as exc:
        service_missing("Redis", f"{type(exc).__name__}: {exc}".splitlines()[0])
    try:
        databases = int(admin.config_get("databases").get("databases", 16))
    except redis.RedisError:  # CONFIG may be disabled; 16 is Redis's default
        databases = 16
    admin.close()
    order = list(range(1, databases))
    uuid_offset = uuid.uuid4().int % len(order)
    for db in order[uuid_offset:] + order[:uuid_offset]:
        client = redis.Redis.from_url(f"{base}/{db}")
        # Claim the database with a marker key, only if it is empty.
        if client.dbsize() == 0 and client.set("gate-test-owner", "1", nx=True):
            try:
                yield f"{base}/{db}"
            finally:
                client.flushdb()
                client.close()
            return
        client.close()
    service_missing("an empty Redis database", "every logical database is in use")


@pytest.fixture
def lost_after_s() -> float:
    """Heartbeat age at which a gate counts as lost. 10 s, so that a live worker on two busy
    cores is never taken for a lost one; the SIGKILL test parametrizes it down to 3 s."""
    return 10.0


@pytest.fixture
def requeue_after_s() -> float:
    """Age at which a pending gate whose task the broker lost is queued again."""
    return 60.0


@pytest.fixture
def settings(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    lost_after_s: float,
    requeue_after_s: float,
    receiver: Receiver,
) -> Settings:
    return Settings(
        database_url=postgres_url,
        broker_url=redis_url,
        data_dir=tmp_path / "data",
        heartbeat_s=HEARTBEAT_S,
        lost_after_s=lost_after_s,
        requeue_after_s=requeue_after_s,
        broker_visibility_timeout_s=VISIBILITY_TIMEOUT_S,
        callback_allow=[f"{receiver.url}/repos/acme/"],
        public_url="http://gate.test",
    )


@pytest.fixture
def factory(settings: Settings) -> Iterator[sessionmaker[Session]]:
    """The test's view of the database, migrated before any worker starts."""
    f = open_factory(settings)
    yield f
    bind = f.kw["bind"]
    bind.dispose()


@dataclass
class WorkerProcess:
    """One `gate worker` subprocess, its log in a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"worker@{os.uname().nodename}:{self.proc.pid}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> float:
        """Seconds until `text` appears in the log; fails after `timeout`."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if text in self.log():
                return time.monotonic() - t0
            if self.proc.poll() is not None:
                code = self.proc.returncode
                pytest.fail(f"worker exited ({code}) before {text!r}:\n{self.log()}")
            time.sleep(0.1)
        pytest.fail(f"{text!r} not in the worker log after {timeout}s:\n{self.log()[-4000:]}")

    def stop(self, timeout: float = 30.0) -> int:
        return stop_process(self.proc, timeout)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the log of every worker it started."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for w in getattr(item, "gate_workers", []):
            report.sections.append((f"worker {w.name} (exit {w.proc.poll()})", w.log()[-8000:]))


@pytest.fixture
def start_worker(
    settings: Settings,
    tmp_path: Path,
    factory: sessionmaker[Session],
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []
    request.node.gate_workers = started

    def start(*args: str, wait_ready: bool = True) -> WorkerProcess:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GATE_")},
            "GATE_DATABASE_URL": str(settings.database_url),
            "GATE_BROKER_URL": str(settings.broker_url),
            "GATE_DATA_DIR": str(settings.data_dir),
            "GATE_HEARTBEAT_S": str(settings.heartbeat_s),
            "GATE_LOST_AFTER_S": str(settings.lost_after_s),
            "GATE_BROKER_VISIBILITY_TIMEOUT_S": str(settings.broker_visibility_timeout_s),
            "GATE_REQUEUE_AFTER_S": str(settings.requeue_after_s),
            "GATE_CALLBACK_ALLOW": json.dumps(settings.callback_allow),
            "GATE_PUBLIC_URL": settings.public_url,
        }
        log_path = tmp_path / f"worker-{len(started)}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gate", "worker", *args],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        w = WorkerProcess(proc, log_path)
        started.append(w)
        if wait_ready:
            w.wait_for(f"{w.name} ready", READY_TIMEOUT_S)
        return w

    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


@pytest.fixture
def tag(find_processes: Callable[[str], list[int]]) -> Iterator[str]:
    """A marker on the test's sim engines; none may outlive the test."""
    t = uuid.uuid4().hex
    yield t
    deadline = time.monotonic() + 10
    while find_processes(t) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert find_processes(t) == [], "an engine process outlived its gate"
