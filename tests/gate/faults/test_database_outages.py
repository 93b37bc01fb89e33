"""The fault suite for database outages: a private, real PostgreSQL server (its own data
directory and port, so stopping it touches no other test) under whole gates on real sim
engines, stopped mid-scenario for less than the lease's safe window, for longer than the lease,
and for longer than GATE_LOST_AFTER_S with the broker (real Redis) still reachable.

Each asserts the gate's final state and reason, that no two gates' engines ever hold the same
GPUs (the second grant is taken the moment the database is back, and the first gate's engine
processes are gone by then), that no engine process is left, and that the lease rows end clean.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import make_engine, make_sessionmaker
from gate.core.settings import Settings
from gate.reservations import leases
from gate.reservations.allocator import ShapeRequest
from gate.reservations.inventory import load_inventory
from gate.runs import store
from gate.runs.dispatch import Reaper
from gate.runs.runner import GateOutcome, GateRunner
from gate.spec import parse_spec
from gate.worker.liveness import BrokerLiveness

pytestmark = pytest.mark.slow

SIM = ["python", "-m", "gate.engines.sim", "--port", "{port}", "--model", "{model}"]


def _pg_bin() -> Path | None:
    root = Path("/usr/lib/postgresql")
    versions = sorted((p for p in root.glob("*/bin") if (p / "initdb").exists()), key=str)
    if versions:
        return versions[-1]
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Postgres:
    """A PostgreSQL server of this test's own: `stop` and `start` are the outage."""

    bindir: Path
    data: Path
    port: int
    as_user: list[str]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://gate@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-o", opts, "-l", str(self.data / "server.log"), "start")

    def stop(self) -> None:
        self._ctl("-m", "immediate", "stop")


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    bindir = _pg_bin()
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: PostgreSQL's server binaries are part of the test services")
        pytest.skip("no PostgreSQL server binaries on this machine")
    # Not under pytest's tmp_path: its parents are private to this user, and the server may
    # have to run as `postgres`.
    data = Path(tempfile.mkdtemp(prefix="gate-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the server as the postgres user
        shutil.chown(data, "postgres", "postgres")
        data.chmod(0o700)
        as_user = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "gate"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pg = Postgres(bindir, data, _free_port(), as_user)
    pg.start()
    try:
        yield pg
    finally:
        with_stop = subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        assert with_stop.returncode in (0, 1)
        shutil.rmtree(data, ignore_errors=True)


@dataclass
class Gate:
    runner: GateRunner
    thread: threading.Thread
    result: list[GateOutcome]

    def wait(self, timeout_s: float) -> GateOutcome:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the gate did not finish"
        assert self.result, "the gate ended without an outcome"
        return self.result[0]


def _start_gate(
    pg: Postgres, tmp_path: Path, tag: str, settings: Settings, alive: Callable[[], None] | None
) -> Gate:
    engine = {"command": [*SIM, "--tag", tag, "--profile", "tiny"]}
    spec = parse_spec(
        {
            "name": "outage",
            "model": "demo-model",
            "reference": engine,
            "candidate": engine,
            "scenarios": [{"name": "steady", "rate": 10, "requests": 400, "max_tokens": 4}],
        }
    )
    runner = GateRunner(spec, settings, report_dir=tmp_path / "reports", db_url=pg.url, alive=alive)
    result: list[GateOutcome] = []
    thread = threading.Thread(target=lambda: result.append(asyncio.run(runner.run())))
    thread.start()
    return Gate(runner, thread, result)


def _wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # the database may be down: keep looking
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _gpus_of(pid: int) -> set[int]:
    """The GPUs a running engine process was given, from its environment."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for item in environ:
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            value = item.split(b"=", 1)[1].decode()
            return {int(g) for g in value.split(",") if g}
    return set()


def _factory(pg: Postgres) -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(pg.url))


def _in_scenario(factory: sessionmaker[Session], gate: Gate) -> Callable[[], bool]:
    def check() -> bool:
        run = store.get_gate(factory, gate.runner.gate_id)
        return (run.phase or "").startswith("scenario:")

    return check


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(data_dir=tmp_path / ".gate", heartbeat_s=0.5, **kw)


def test_an_outage_shorter_than_the_lease_loses_nothing(
    postgres: Postgres, tmp_path: Path, tag: str
) -> None:
    """Down 4 s with a 20 s lease (renewed every 3.3 s, safe for 12 s after each): it runs on, its
    heartbeats and phases are written once the database is back, it decides, and releases."""
    settings = _settings(tmp_path, lease_ttl_s=20.0)
    gate = _start_gate(postgres, tmp_path, tag, settings, None)
    factory = _factory(postgres)
    _wait_for(_in_scenario(factory, gate), 90, "the scenario to start")
    postgres.stop()
    time.sleep(4.0)
    postgres.start()
    out = gate.wait(180)
    assert out.doc.state == "complete", out.doc.reasons
    assert out.doc.reservation is not None and out.doc.reservation.state == "released"
    phases = [(p.role, p.phase) for p in store.all_phases(factory, out.gate_id)]
    assert ("gate", "judging") in phases and ("gate", "released") in phases  # none lost
    assert ("gate", "database_back") in phases  # and it says what happened
    assert any("could not write to its database for" in n for n in out.doc.notes)
    assert leases.active_leases(factory) == []
    print(
        f"\nFAULT postgres down 4 s (lease 20 s): {out.doc.state}, {out.doc.verdict}, "
        f"reservation {out.doc.reservation.state}, {len(phases)} phase rows"
    )


def test_an_outage_longer_than_the_lease_stops_the_gate_before_anyone_gets_its_gpus(
    postgres: Postgres, tmp_path: Path, tag: str, find_processes: Callable[[str], list[int]]
) -> None:
    """Down 14 s with an 8 s lease: the gate stops its engines within the lease, holds with
    code lease_lost once the database is back, and a gate granted those GPUs the moment the
    database returns finds no engine of the first still running."""
    settings = _settings(tmp_path, lease_ttl_s=8.0)
    gate = _start_gate(postgres, tmp_path, tag, settings, None)
    factory = _factory(postgres)
    _wait_for(_in_scenario(factory, gate), 90, "the scenario to start")
    first = store.get_gate(factory, gate.runner.gate_id)
    assert first.state == "running"
    engines_during = find_processes(tag)
    assert len(engines_during) == 2
    booked = gate.runner.booking
    assert booked is not None and booked.grant is not None
    placed = booked.grant.placement.engines
    # What the engines were given is what the lease rows hold.
    assert sorted(set().union(*(_gpus_of(p) for p in engines_during))) == sorted(
        {g for e in placed for g in e.gpus}
    )
    held = {(e.node, g) for e in placed for g in e.gpus}
    postgres.stop()
    down_at = time.monotonic()
    _wait_for(lambda: find_processes(tag) == [], 12, "the gate to stop its engines")
    stopped_after = time.monotonic() - down_at
    assert stopped_after < settings.lease_ttl_s, f"engines ran {stopped_after:.1f} s into it"
    time.sleep(max(0.0, 14.0 - (time.monotonic() - down_at)))
    postgres.start()
    # The second gate asks for the whole node (8 GPUs: it fits only on the first gate's GPUs
    # too) as soon as the database answers.
    grant = None
    deadline = time.monotonic() + 60
    while grant is None and time.monotonic() < deadline:
        try:
            grant = leases.reserve(
                factory,
                load_inventory(None),
                ShapeRequest(gpus_per_engine=4),
                holder="second",
                gate_id=None,
                ttl_s=60,
            )
        except Exception:
            time.sleep(0.2)
    assert grant is not None
    granted = {(e.node, g) for e in grant.placement.engines for g in e.gpus}
    assert held & granted, "the second gate got the first gate's GPUs (what the fault needs)"
    assert find_processes(tag) == [], "two gates' engines on the same GPUs"
    out = gate.wait(120)
    assert (out.doc.state, out.doc.verdict) == ("error", "hold")
    assert out.doc.error is not None and out.doc.error.code == "lease_lost"
    assert "could not be renewed" in out.doc.reasons[0].message
    assert out.doc.reservation is not None and out.doc.reservation.state == "lost"
    assert store.get_gate(factory, out.gate_id).state == "error"  # written once it was back
    leases.release(factory, grant.reservation_id, "test over")
    print(
        f"\nFAULT postgres down 14 s (lease 8 s): engines stopped {stopped_after:.1f} s "
        f"into the outage; {out.doc.state}/{out.doc.verdict} {out.doc.error.code}; "
        f"reservation {out.doc.reservation.state}; next grant {grant.reservation_id} found "
        f"no engine of the first"
    )


def test_an_outage_longer_than_lost_after_does_not_reap_a_live_gate(
    postgres: Postgres, tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down 9 s with GATE_LOST_AFTER_S 4 and a 30 s lease, and the worker still cut off from
    the database for a moment after it is back (as a partition is): the database heartbeat is
    stale, but the broker (real Redis) holds the gate's proof of life, so the reaper spares it
    and says so; the gate runs to its verdict."""
    redis_url = os.environ.get("GATE_TEST_REDIS_URL")
    if not redis_url:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: Redis is part of the test services")
        pytest.skip("GATE_TEST_REDIS_URL not set")
    cut = threading.Event()
    real_beat = store.beat

    def beat(*args: Any) -> str | None:
        if cut.is_set():
            raise ConnectionError("the worker cannot reach the database")
        return real_beat(*args)

    monkeypatch.setattr(store, "beat", beat)
    settings = _settings(tmp_path, lease_ttl_s=30.0, lost_after_s=4.0)
    broker = BrokerLiveness(redis_url, settings.lost_after_s)
    holder: list[str] = []
    gate = _start_gate(
        postgres, tmp_path, tag, settings, lambda: broker.beat(holder[0], "worker@test")
    )
    holder.append(gate.runner.gate_id)
    factory = _factory(postgres)
    reaper = Reaper(settings, factory, liveness=broker)
    try:
        _wait_for(_in_scenario(factory, gate), 90, "the scenario to start")
        cut.set()
        postgres.stop()
        time.sleep(9.0)
        postgres.start()
        _wait_for(lambda: store.get_gate(factory, gate.runner.gate_id) is not None, 30, "the db")
        beat_at = store.get_gate(factory, gate.runner.gate_id).heartbeat_at
        assert beat_at is not None
        age = datetime.now(UTC) - (beat_at if beat_at.tzinfo else beat_at.replace(tzinfo=UTC))
        assert age.total_seconds() > settings.lost_after_s  # what reaped live gates, as filed
        assert reaper.once() == [] and reaper.spared == [gate.runner.gate_id]
        cut.clear()
        out = gate.wait(180)
        assert out.doc.state == "complete", out.doc.reasons
        assert out.doc.ended_elsewhere is None
        print(
            f"\nFAULT postgres down 9 s, worker cut off (lost_after 4 s): heartbeat "
            f"{age.total_seconds():.0f} s stale, spared by the broker; {out.doc.state}, "
            f"{out.doc.verdict}"
        )
    finally:
        cut.clear()
        broker.forget(gate.runner.gate_id)
        broker.close()
