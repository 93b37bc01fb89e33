"""The broker's proof of life (real Redis): a worker cut off from the database keeps its gates
from being reaped; a broker that cannot be read proves no death; the reason names what went
silent."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate.core.clock import now
from gate.core.database import make_engine, make_sessionmaker, transaction, upgrade
from gate.core.settings import Settings
from gate.models import GateRun
from gate.service import service
from gate.service.reaper import Reaper
from gate.worker.broker_liveness import BrokerLiveness

REDIS = os.environ.get("GATE_TEST_REDIS_URL")
needs_redis = pytest.mark.skipif(
    not REDIS and os.environ.get("CI") != "true", reason="GATE_TEST_REDIS_URL not set"
)


@pytest.fixture
def factory(tmp_path: Path) -> sessionmaker[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    upgrade(engine)
    return make_sessionmaker(engine)


def _running(factory: sessionmaker[Session], silent_s: float) -> str:
    gid = uuid.uuid4().hex
    with transaction(factory) as s:
        s.add(
            GateRun(
                id=gid,
                name="n",
                spec={},
                state="running",
                worker="worker@host:1",
                heartbeat_at=now() - timedelta(seconds=silent_s),
            )
        )
    return gid


@needs_redis
def test_a_gate_alive_in_the_broker_is_not_reaped_while_its_database_heartbeat_is_stale(
    factory: sessionmaker[Session],
) -> None:
    assert REDIS, "CI=true: Redis is part of the test services"
    alive, dead = _running(factory, 120), _running(factory, 120)
    live = BrokerLiveness(REDIS, ttl_s=30)
    live.beat(alive, "worker@host:1")
    try:
        reaper = Reaper(Settings(lost_after_s=30), factory, liveness=live)
        assert reaper.once() == [dead]
        assert service.get_gate(factory, alive).state == "running"
        reason = service.get_gate(factory, dead).reason or ""
        assert "stopped sending heartbeats 120s ago, to the database and to the broker" in reason
    finally:
        live.forget(alive)
        live.close()


def test_a_broker_that_cannot_be_read_proves_no_death(factory: sessionmaker[Session]) -> None:
    gid = _running(factory, 120)
    unreachable = BrokerLiveness("redis://127.0.0.1:9/0", ttl_s=30)  # nothing listens on 9
    assert unreachable.alive_ids() is None
    unreachable.beat(gid, "w")  # logged, never raised
    reaper = Reaper(Settings(lost_after_s=30), factory, liveness=unreachable)
    assert reaper.once() == []
    assert service.get_gate(factory, gid).state == "running"


def test_without_a_broker_the_reason_says_there_was_none_to_ask(
    factory: sessionmaker[Session],
) -> None:
    gid = _running(factory, 90)
    assert Reaper(Settings(lost_after_s=30), factory).once() == [gid]
    assert "no broker to ask whether it is alive" in (service.get_gate(factory, gid).reason or "")
