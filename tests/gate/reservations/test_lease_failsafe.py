"""Leases fail safe: an expiry is written from the database's clock at the moment of the write,
even after the renewal waited for a lock; a lease that cannot be renewed in time, or that was
ended elsewhere, tells its gate to stop before the GPUs could go to anyone else."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import make_engine, make_sessionmaker, transaction, upgrade
from gate.models import Reservation
from gate.reservations import leases
from gate.reservations.allocator import ShapeRequest
from gate.reservations.inventory import load_inventory
from gate.reservations.service import STOP_MARGIN, GateReservation


def _factory(tmp_path: Path) -> tuple[sessionmaker[Session], Path]:
    path = tmp_path / "leases.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    return make_sessionmaker(engine), path


def _grant(factory: sessionmaker[Session], ttl_s: float) -> leases.Grant:
    return leases.reserve(
        factory,
        load_inventory(None),
        ShapeRequest(gpus_per_engine=1),
        holder="t",
        gate_id=None,
        ttl_s=ttl_s,
    )


def _expiry(factory: sessionmaker[Session], rid: int) -> datetime:
    with transaction(factory) as s:
        row = s.get(Reservation, rid)
        assert row is not None
        at = row.expires_at
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _hold_write_lock(path: Path, seconds: float, taken: threading.Event) -> threading.Thread:
    """Another writer holding SQLite's write lock (what a long transaction elsewhere does)."""

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        taken.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    return t


def test_a_renewal_that_waited_for_the_lock_writes_its_expiry_from_the_moment_of_the_write(
    tmp_path: Path,
) -> None:
    factory, path = _factory(tmp_path)
    grant = _grant(factory, 60)
    taken = threading.Event()
    holder = _hold_write_lock(path, 2.0, taken)
    assert taken.wait(5)
    assert leases.heartbeat(factory, grant.reservation_id, 60)  # waits ~2 s for the lock
    released = datetime.now(UTC)
    holder.join()
    # Computed before the wait, the expiry would be ~2 s short of `released + 60 s`.
    assert (_expiry(factory, grant.reservation_id) - released).total_seconds() > 59.5


async def _held(factory: sessionmaker[Session], ttl_s: float) -> GateReservation:
    booked = GateReservation(
        factory, lambda: load_inventory(None), ShapeRequest(gpus_per_engine=1), "g1", ttl_s
    )
    await booked.reserve()
    return booked


def test_a_lease_the_database_will_not_renew_stops_the_gate_before_it_could_expire(
    tmp_path: Path,
) -> None:
    """SQLite's write lock held past the lease's TTL (as a long writer elsewhere does): the
    gate is told to stop inside the TTL, with a margin for its teardown, and no other reserver
    gets those GPUs meanwhile (it waits for the same lock, then finds them held)."""
    factory, path = _factory(tmp_path)
    ttl = 4.0

    async def scenario() -> tuple[float, float, str, float]:
        booked = await _held(factory, ttl)
        t0 = time.monotonic()
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        booked.start_keep_alive(lambda why: lost.done() or lost.set_result(why))
        taken = threading.Event()
        _hold_write_lock(path, ttl * 2, taken)
        why = await asyncio.wait_for(lost, ttl * 3)
        at = time.monotonic() - t0
        await booked.stop_keep_alive()
        return at, booked._held_from - t0, why, booked.margin_s()

    at, held_from, why, margin = asyncio.run(scenario())
    # Told to stop by the time its teardown margin was left, counted from the last write.
    assert margin >= ttl * STOP_MARGIN
    assert at <= held_from + ttl - margin + 0.5
    assert at < ttl, f"the gate heard of it only after {at:.1f} s, past its {ttl} s TTL"
    assert "reservation" in why and ("waited on the database" in why or "could not" in why)


def test_a_lease_reaped_elsewhere_stops_the_gate_at_its_next_renewal(tmp_path: Path) -> None:
    factory, _ = _factory(tmp_path)

    async def scenario() -> str:
        booked = await _held(factory, 3.0)
        assert booked.grant is not None
        leases.release(factory, booked.grant.reservation_id, "released by a reaper")
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        booked.start_keep_alive(lambda why: lost.done() or lost.set_result(why))
        why = await asyncio.wait_for(lost, 10)
        rid = await booked.release("gate error")
        assert rid == booked.grant.reservation_id
        doc = booked.describe()
        assert doc is not None and doc.state == "lost"
        assert doc.lost is not None and "released by a reaper" in doc.lost
        return why

    assert "ended elsewhere" in asyncio.run(scenario())


def test_renewals_retry_through_a_short_outage_and_keep_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two failed renewals (the database restarting), then success: the lease is kept."""
    factory, _ = _factory(tmp_path)
    real = leases.heartbeat
    calls = {"n": 0}

    renewed = threading.Event()

    def flaky(*args: object) -> bool:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise ConnectionError("the database is restarting")
        ok = real(*args)  # type: ignore[arg-type]
        renewed.set()
        return ok

    monkeypatch.setattr(leases, "heartbeat", flaky)

    async def scenario() -> GateReservation:
        booked = await _held(factory, 12.0)
        lost: list[str] = []
        booked._held_from = time.monotonic()
        booked.start_keep_alive(lost.append)
        await asyncio.to_thread(renewed.wait, 20)
        await booked.stop_keep_alive()
        assert lost == []
        return booked

    booked = asyncio.run(scenario())
    assert calls["n"] >= 3 and booked.lost is None
    assert booked.describe() is not None


def test_a_lease_lost_to_an_outage_names_the_error_even_when_its_last_try_hung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals fail (the database refuses connections), then the last try hangs until the
    gate must stop: the reason names the outage's error, not only the wait (on a busy host
    the last try can start a few milliseconds before the stop and time out)."""
    factory, _ = _factory(tmp_path)
    calls = {"n": 0}
    hang = threading.Event()

    def refused_then_hung(*args: object) -> bool:
        calls["n"] += 1
        if calls["n"] >= 2:
            hang.wait(30)
            return True
        raise ConnectionError("could not connect to the database")

    monkeypatch.setattr(leases, "heartbeat", refused_then_hung)

    async def scenario() -> str:
        booked = await _held(factory, 6.0)
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        booked.start_keep_alive(lambda why: lost.done() or lost.set_result(why))
        why = await asyncio.wait_for(lost, 20)
        hang.set()
        await booked.stop_keep_alive()
        return why

    why = asyncio.run(scenario())
    assert calls["n"] == 2
    assert "waited on the database" in why
    assert "ConnectionError: could not connect to the database" in why


def test_a_sweep_of_expired_leases_reads_the_database_clock(tmp_path: Path) -> None:
    """An expiry is compared with the database's time, not the reserving host's."""
    factory, _ = _factory(tmp_path)
    grant = _grant(factory, 0.5)
    time.sleep(0.8)
    with transaction(factory) as s:
        assert leases.reap_expired(s) == 1
    assert leases.release(factory, grant.reservation_id, "late") is not None  # already ended
    assert os.path.exists(tmp_path / "leases.db")


def test_a_release_retried_after_its_commit_was_not_acknowledged_is_a_release(
    tmp_path: Path,
) -> None:
    """The first release committed but the connection died before the acknowledgement, so the
    journal retried it: the row already says released, with this release's own reason. The
    document says "released"; only a release by someone else (a reaper) reads as lost."""
    factory, _ = _factory(tmp_path)

    async def scenario() -> tuple[str, str]:
        ours = await _held(factory, 30.0)
        assert ours.grant is not None
        assert leases.release(factory, ours.grant.reservation_id, "gate complete") is None
        ours.release_now("gate complete")  # the retry
        theirs = await _held(factory, 30.0)
        assert theirs.grant is not None
        leases.release(factory, theirs.grant.reservation_id, "worker lost")
        theirs.release_now("gate complete")
        a, b = ours.describe(), theirs.describe()
        assert a is not None and b is not None
        return a.state, b.state

    assert asyncio.run(scenario()) == ("released", "lost")
