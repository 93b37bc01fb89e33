"""Leases against a real PostgreSQL: many reserver processes at once never share a GPU."""

from __future__ import annotations

import multiprocessing as mp
import time

from sqlalchemy import select

from gate.core.database import make_engine, make_sessionmaker, transaction, upgrade
from gate.models import GpuLease, Reservation
from gate.reservations import leases
from gate.reservations.allocator import ShapeRequest
from gate.reservations.inventory import Inventory, Node

HOSTS = 15
INV = Inventory(
    name="pg",
    nodes=[Node(name=f"h{i}", sku="H200", gpu_memory_gib=141, gpus=8) for i in range(HOSTS)],
)
SHAPE = ShapeRequest(gpus_per_engine=1)
RESERVERS = 50
ATTEMPTS = 2  # 100 attempts for 60 gate pairs: contention and blocked answers both happen


def _reserver(url: str, barrier: mp.synchronize.Barrier, out: mp.Queue) -> None:  # type: ignore[type-arg]
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    got: list[tuple[int, list[tuple[str, int]]]] = []
    blocked = 0
    codes: list[str] = []
    barrier.wait(timeout=120)
    for i in range(ATTEMPTS):
        try:
            g = leases.reserve(factory, INV, SHAPE, holder=f"r{i}", gate_id=None, ttl_s=300)
            got.append((g.reservation_id, [k for _, k in g.placement.gpu_keys()]))
        except leases.BlockedReservation as exc:
            codes.append(exc.blocked.code)
            blocked += 1
    engine.dispose()
    out.put((got, blocked, codes))


def test_fifty_concurrent_reservers_never_double_book(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    upgrade(engine)
    engine.dispose()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(RESERVERS)
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [
        ctx.Process(target=_reserver, args=(postgres_url, barrier, q)) for _ in range(RESERVERS)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    grants = [g for got, _, _ in results for g in got]
    blocked = sum(b for _, b, _ in results)
    assert {c for _, _, codes in results for c in codes} == {"lease_conflict"}
    gpus = [k for _, keys in grants for k in keys]
    capacity_pairs = HOSTS * 8 // 2
    assert len(grants) == capacity_pairs and blocked == RESERVERS * ATTEMPTS - capacity_pairs
    assert len(gpus) == len(set(gpus)) == HOSTS * 8
    fences = [rid for rid, _ in grants]
    assert len(set(fences)) == len(fences)
    factory = make_sessionmaker(make_engine(postgres_url))
    with transaction(factory) as s:
        rows = list(s.scalars(select(GpuLease)))
        assert len(rows) == HOSTS * 8
        assert {r.reservation_id for r in rows} == set(fences)
        active = list(s.scalars(select(Reservation).where(Reservation.state == "active")))
        assert len(active) == capacity_pairs
    assert time.monotonic() - t0 < 170


def test_release_and_reap_on_postgres(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    upgrade(engine)
    factory = make_sessionmaker(engine)
    g = leases.reserve(factory, INV, SHAPE, holder="x", gate_id=None, ttl_s=0.01)
    time.sleep(0.05)
    g2 = leases.reserve(factory, INV, SHAPE, holder="y", gate_id=None, ttl_s=60)
    assert g2.reservation_id > g.reservation_id
    with transaction(factory) as s:
        r = s.get(Reservation, g.reservation_id)
        assert r is not None and r.state == "expired"
    leases.release(factory, g2.reservation_id, "done")
    assert leases.active_leases(factory) == []
    engine.dispose()
