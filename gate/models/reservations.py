"""GPU reservations: a history row per reservation, and one lease row per GPU while it is held.

The primary key of `gpu_leases` is the GPU itself, so the database, not the application, makes
it impossible for one GPU to be in two active reservations.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gate.models.base import Base, utcnow


class Reservation(Base):
    __tablename__ = "reservations"

    # The integer id only ever grows, so it doubles as the fence token of the grant.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gate_id: Mapped[str | None] = mapped_column(String(32), index=True)
    holder: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), index=True)  # active | released | expired
    inventory: Mapped[str] = mapped_column(String(200))
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    placement: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    release_reason: Mapped[str | None] = mapped_column(Text)


class InventoryLock(Base):
    """One row per inventory: reservers of one inventory take its row lock (SELECT ... FOR
    UPDATE on PostgreSQL) so they allocate one at a time against committed state, instead of
    racing for the same GPUs and retrying."""

    __tablename__ = "inventory_locks"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    grants: Mapped[int] = mapped_column(Integer, default=0)


class GpuLease(Base):
    __tablename__ = "gpu_leases"

    inventory: Mapped[str] = mapped_column(String(200), primary_key=True)
    node: Mapped[str] = mapped_column(String(200), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    reservation_id: Mapped[int] = mapped_column(
        ForeignKey("reservations.id", ondelete="CASCADE"), index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
