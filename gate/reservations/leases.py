"""Reservations held in the database: grant, heartbeat, release, reap.

A grant inserts one `gpu_leases` row per GPU; the GPU is that table's primary key, so a second
reserver racing for the same GPU gets an integrity error from the database and retries against
the fresh state. Expired leases (a crashed holder stopped its heartbeat) are reaped first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import db_now, transaction
from gate.core.errors import BlockedReservation as BlockedReservation  # it lived here: re-exported
from gate.core.errors import ReservationError
from gate.models import GpuLease, InventoryLock, Reservation
from gate.reservations.allocator import Blocked, Placement, ShapeRequest, allocate
from gate.reservations.inventory import Inventory

MAX_RACE_RETRIES = 8


@dataclass(frozen=True, slots=True)
class Grant:
    reservation_id: int  # also the fence token: it only ever grows
    placement: Placement
    expires_at: datetime

    def describe(self) -> str:
        out = []
        for e in self.placement.engines:
            if len(e.groups) > 1:
                groups = ", ".join(
                    f"{g.role} on "
                    + " ".join(f"{n} GPU {','.join(map(str, gpus))}" for n, gpus in g.workers)
                    for g in e.groups
                )
                out.append(f"{e.role}: {groups}")
            else:
                out.append(f"{e.role} on {e.node} GPU {e.cuda_visible_devices}")
        return "; ".join(out)


def reap_expired(session: Session, now: datetime | None = None) -> int:
    """End the leases whose expiry has passed by the database's clock (or `now`).

    Lock order, everywhere a lease is written: its `reservations` row first, then its
    `gpu_leases` rows, so a renewal and a reaper never wait on each other in a circle. A
    renewal that got the row first (and extended it) is not reaped: the expiry is checked
    again on the locked row."""
    now = now or db_now(session)
    expired = list(
        session.scalars(
            select(Reservation.id)
            .where(Reservation.state == "active", Reservation.expires_at < now)
            .with_for_update()
        )
    )
    if not expired:
        return 0
    session.execute(delete(GpuLease).where(GpuLease.reservation_id.in_(expired)))
    session.execute(
        update(Reservation)
        .where(Reservation.id.in_(expired), Reservation.expires_at < now)
        .values(state="expired", released_at=now, release_reason="lease expired (no heartbeat)")
    )
    return len(expired)


def _lock_inventory(session: Session, name: str) -> InventoryLock:
    """Take the inventory's row lock for this transaction (FOR UPDATE on PostgreSQL; SQLite
    transactions are already serialised by BEGIN IMMEDIATE)."""
    query = select(InventoryLock).where(InventoryLock.name == name).with_for_update()
    row = session.scalars(query).one_or_none()
    if row is None:
        session.add(InventoryLock(name=name, grants=0))
        session.flush()  # a concurrent creator makes this an IntegrityError: the caller retries
        row = session.scalars(query).one()
    return row


def placement_to_json(placement: Placement) -> dict[str, Any]:
    return {"engines": [asdict(e) for e in placement.engines]}


def reserve(
    factory: sessionmaker[Session],
    inventory: Inventory,
    shape: ShapeRequest,
    *,
    holder: str,
    gate_id: str | None,
    ttl_s: float,
) -> Grant:
    """Grant a placement for both engines or raise BlockedReservation with the layered reason."""
    for _attempt in range(MAX_RACE_RETRIES):
        try:
            with transaction(factory) as session:
                lock = _lock_inventory(session, inventory.name)
                reap_expired(session)
                held = session.execute(
                    select(GpuLease.node, GpuLease.gpu_index).where(
                        GpuLease.inventory == inventory.name
                    )
                ).all()
                result = allocate(inventory.nodes, shape, [(n, g) for n, g in held])
                if isinstance(result, Blocked):
                    raise BlockedReservation(result)
                expires = db_now(session) + timedelta(seconds=ttl_s)
                res = Reservation(
                    gate_id=gate_id,
                    holder=holder,
                    state="active",
                    inventory=inventory.name,
                    shape=asdict(shape),
                    placement=placement_to_json(result),
                    expires_at=expires,
                )
                session.add(res)
                session.flush()
                for role, (node, gpu) in result.gpu_keys():
                    session.add(
                        GpuLease(
                            inventory=inventory.name,
                            node=node,
                            gpu_index=gpu,
                            reservation_id=res.id,
                            role=role,
                            expires_at=expires,
                        )
                    )
                lock.grants += 1
                session.flush()
                return Grant(res.id, result, expires)
        except IntegrityError:
            continue  # another reserver took one of these GPUs first: look again
    raise ReservationError(f"gave up after {MAX_RACE_RETRIES} races with other reservers")


def heartbeat(factory: sessionmaker[Session], reservation_id: int, ttl_s: float) -> bool:
    """Extend an active lease to `ttl_s` past the database's clock at the moment of the
    write (a renewal that waited for a lock does not write an expiry already past); False
    when it was already reaped or released."""
    with transaction(factory) as session:
        # The row first (a lock another writer holds is waited for here), then the clock.
        session.execute(
            select(Reservation.id).where(Reservation.id == reservation_id).with_for_update()
        )
        expires = db_now(session) + timedelta(seconds=ttl_s)
        renewed = session.scalars(
            update(Reservation)
            .where(Reservation.id == reservation_id, Reservation.state == "active")
            .values(expires_at=expires)
            .returning(Reservation.id)
        ).all()
        if not renewed:
            return False
        session.execute(
            update(GpuLease)
            .where(GpuLease.reservation_id == reservation_id)
            .values(expires_at=expires)
        )
        return True


def release(factory: sessionmaker[Session], reservation_id: int, reason: str) -> str | None:
    """Release an active lease. Returns None when this released it, else how it had ended
    before (its state and reason: reaped as expired, released by a reaper). A release that
    finds the row released with this very reason is its own retry (the first attempt committed
    but its acknowledgement was lost with the connection): that is a release too, not a loss."""
    with transaction(factory) as session:
        # The reservation row first (the lock order of reap_expired).
        session.execute(
            select(Reservation.id).where(Reservation.id == reservation_id).with_for_update()
        )
        session.execute(delete(GpuLease).where(GpuLease.reservation_id == reservation_id))
        done = session.scalars(
            update(Reservation)
            .where(Reservation.id == reservation_id, Reservation.state == "active")
            .values(state="released", released_at=db_now(session), release_reason=reason)
            .returning(Reservation.id)
        ).all()
        if done:
            return None
        row = session.get(Reservation, reservation_id)
        if row is None:
            return "unknown"
        if row.state == "released" and row.release_reason == reason:
            return None
        return f"{row.state} ({row.release_reason})"


def active_leases(factory: sessionmaker[Session]) -> list[GpuLease]:
    with transaction(factory) as session:
        return list(session.scalars(select(GpuLease)))


def held_gpus(factory: sessionmaker[Session], inventory: str) -> list[tuple[str, int]]:
    """(node, gpu index) of every GPU of `inventory` a reservation holds now."""
    with transaction(factory) as session:
        rows = session.execute(
            select(GpuLease.node, GpuLease.gpu_index).where(GpuLease.inventory == inventory)
        ).all()
    return [(node, int(gpu)) for node, gpu in rows]


def list_reservations(
    factory: sessionmaker[Session], *, active: bool, limit: int
) -> list[dict[str, Any]]:
    """Reservations newest first (only the active ones when `active`), as plain fields."""
    q = select(Reservation).order_by(Reservation.id.desc()).limit(limit)
    if active:
        q = q.where(Reservation.state == "active")
    with transaction(factory) as session:
        return [
            {
                "id": r.id,
                "gate_id": r.gate_id,
                "holder": r.holder,
                "state": r.state,
                "inventory": r.inventory,
                "placement": r.placement,
                "created_at": r.created_at,
                "expires_at": r.expires_at,
                "released_at": r.released_at,
                "release_reason": r.release_reason,
            }
            for r in session.scalars(q).all()
        ]
