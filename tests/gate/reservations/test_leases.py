from __future__ import annotations

import multiprocessing as mp
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import make_engine, make_sessionmaker, transaction
from gate.models import GpuLease, Reservation
from gate.reservations import leases
from gate.reservations.allocator import ConnectRule, GroupRequest, ShapeRequest
from gate.reservations.inventory import Inventory, Node

INV = Inventory(
    name="t",
    nodes=[Node(name="h0", sku="H200", gpu_memory_gib=141, gpus=8)],
)
SHAPE = ShapeRequest(gpus_per_engine=1)


def test_grants_are_disjoint_until_full(factory: sessionmaker[Session]) -> None:
    grants = [
        leases.reserve(factory, INV, SHAPE, holder=f"t{i}", gate_id=None, ttl_s=60)
        for i in range(4)
    ]
    gpus = [k for g in grants for _, k in g.placement.gpu_keys()]
    assert len(gpus) == len(set(gpus)) == 8
    assert [g.reservation_id for g in grants] == sorted(g.reservation_id for g in grants)
    with pytest.raises(leases.BlockedReservation) as info:
        leases.reserve(factory, INV, SHAPE, holder="t5", gate_id=None, ttl_s=60)
    assert info.value.blocked.code == "lease_conflict" and info.value.blocked.retryable
    leases.release(factory, grants[0].reservation_id, "done")
    again = leases.reserve(factory, INV, SHAPE, holder="t6", gate_id=None, ttl_s=60)
    assert {k for _, k in again.placement.gpu_keys()} == {
        k for _, k in grants[0].placement.gpu_keys()
    }
    with transaction(factory) as s:
        r = s.get(Reservation, grants[0].reservation_id)
        assert r is not None and r.state == "released" and r.release_reason == "done"


def test_expired_leases_are_reaped_and_heartbeat_extends(factory: sessionmaker[Session]) -> None:
    grants = [
        leases.reserve(factory, INV, SHAPE, holder="x", gate_id=None, ttl_s=60) for _ in range(4)
    ]
    assert leases.heartbeat(factory, grants[1].reservation_id, 120)
    past = datetime.now(UTC) - timedelta(seconds=1)
    with transaction(factory) as s:
        s.execute(
            update(Reservation)
            .where(Reservation.id == grants[0].reservation_id)
            .values(expires_at=past)
        )
    g = leases.reserve(factory, INV, SHAPE, holder="y", gate_id=None, ttl_s=60)
    assert g.reservation_id > grants[-1].reservation_id  # a new, larger fence token
    with transaction(factory) as s:
        r = s.get(Reservation, grants[0].reservation_id)
        assert r is not None and r.state == "expired"
        holders = set(s.scalars(select(GpuLease.reservation_id)))
    assert grants[0].reservation_id not in holders
    assert not leases.heartbeat(factory, grants[0].reservation_id, 60)


def test_a_multi_group_lease_holds_and_releases_every_gpu_of_every_group(
    factory: sessionmaker[Session],
) -> None:
    inv = Inventory(
        name="pd",
        nodes=[
            Node(name=f"g{i}", sku="GB200", gpu_memory_gib=185, gpus=4, topology={"clique": "q"})
            for i in range(6)
        ],
    )
    shape = ShapeRequest(
        groups=(GroupRequest("prefill", 4), GroupRequest("decode", 8, 2, "clique")),
        connect=(ConnectRule(("prefill", "decode"), "clique"),),
    )
    grant = leases.reserve(factory, inv, shape, holder="pd", gate_id=None, ttl_s=60)
    gpus = {k for _, k in grant.placement.gpu_keys()}
    assert len(gpus) == 24  # 2 engines x (4 prefill + 8 decode): the whole clique
    with transaction(factory) as s:
        rows = list(s.scalars(select(GpuLease)))
        assert {(r.node, r.gpu_index) for r in rows} == gpus
        assert {r.role for r in rows} == {"reference", "candidate"}
        stored = s.get(Reservation, grant.reservation_id)
        assert stored is not None
        groups = [[g["role"] for g in e["groups"]] for e in stored.placement["engines"]]
        assert groups == [["prefill", "decode"]] * 2
    assert "prefill on g" in grant.describe() and "decode on g" in grant.describe()
    with pytest.raises(leases.BlockedReservation) as info:
        leases.reserve(factory, inv, shape, holder="other", gate_id=None, ttl_s=60)
    assert info.value.blocked.code == "lease_conflict"
    assert leases.release(factory, grant.reservation_id, "done") is None
    with transaction(factory) as s:
        assert list(s.scalars(select(GpuLease))) == []
    again = leases.reserve(factory, inv, shape, holder="pd2", gate_id=None, ttl_s=60)
    assert {k for _, k in again.placement.gpu_keys()} == gpus


def _reserve_in_process(url: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    factory = make_sessionmaker(make_engine(url))
    got = []
    for i in range(n):
        try:
            g = leases.reserve(factory, INV, SHAPE, holder=f"p{i}", gate_id=None, ttl_s=60)
            got.extend(k for _, k in g.placement.gpu_keys())
        except leases.BlockedReservation:
            pass
    out.put(got)


def test_parallel_processes_never_share_a_gpu(db_url: str, factory: sessionmaker[Session]) -> None:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_reserve_in_process, args=(db_url, 3, q)) for _ in range(6)]
    for p in procs:
        p.start()
    results = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    gpus = [k for r in results for k in r]
    assert len(gpus) == len(set(gpus)) == 8  # all 4 pairs granted, none twice
    with transaction(factory) as s:
        assert len(list(s.scalars(select(GpuLease)))) == 8
