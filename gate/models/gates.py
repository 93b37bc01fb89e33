"""A gate run, its lifecycle phases, its per-request samples (columnar) and its checks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from gate.models.base import Base, utcnow


class GateRun(Base):
    __tablename__ = "gates"
    # A spec's history, newest first (GET /v1/history/{identity}, the run's comparison).
    __table_args__ = (Index("ix_gates_identity_finished", "identity", "finished_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # pending -> running -> complete | error | cancelled
    state: Mapped[str] = mapped_column(String(16), index=True, default="pending")
    phase: Mapped[str] = mapped_column(String(64), default="created")
    verdict: Mapped[str | None] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    document: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    report_path: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The service's bookkeeping (all optional for a gate run from the command line).
    source: Mapped[str] = mapped_column(String(16), default="cli")  # cli|api|argo|flagger|ci
    idempotency_key: Mapped[str | None] = mapped_column(String(64), unique=True)
    # who started it: `token:<api_tokens.id>`, `ci` (the signed webhook), None (the CLI);
    # only the owner or an admin token may cancel it
    owner: Mapped[str | None] = mapped_column(String(64), index=True)
    reference_label: Mapped[str | None] = mapped_column(String(500))
    candidate_label: Mapped[str | None] = mapped_column(String(500), index=True)
    worker: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    callback: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # Delivery of that callback: tried by whoever finishes the gate, then by any reaper until
    # it is sent, refused, or out of attempts (a gate ended by a reaper gets its status too).
    callback_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    callback_tried_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    callback_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    callback_result: Mapped[str | None] = mapped_column(String(200))
    # The spec's history (gate/spec/identity.py): its identity, whether it is an A/A gate, and
    # the finished gate as the history keeps it (gate/verdict/history.py HistoryEntry).
    identity: Mapped[str | None] = mapped_column(String(16))
    aa: Mapped[bool | None] = mapped_column(Boolean)
    history: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))

    phases: Mapped[list[GatePhase]] = relationship(
        back_populates="gate", lazy="raise", cascade="all, delete-orphan"
    )
    samples: Mapped[list[SampleSet]] = relationship(
        back_populates="gate", lazy="raise", cascade="all, delete-orphan"
    )
    checks: Mapped[list[CheckResult]] = relationship(
        back_populates="gate", lazy="raise", cascade="all, delete-orphan"
    )


class GatePhase(Base):
    """One lifecycle step of the gate or of an engine, on the gate's monotonic clock."""

    __tablename__ = "gate_phases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gate_id: Mapped[str] = mapped_column(ForeignKey("gates.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))  # gate | reference | candidate
    phase: Mapped[str] = mapped_column(String(64))
    at_s: Mapped[float] = mapped_column(Float)  # seconds since the gate started (monotonic)
    detail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    gate: Mapped[GateRun] = relationship(back_populates="phases", lazy="raise")


class SampleSet(Base):
    """Every request of one scenario on one engine, as compressed numpy columns (npz)."""

    __tablename__ = "sample_sets"
    __table_args__ = (UniqueConstraint("gate_id", "scenario", "role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gate_id: Mapped[str] = mapped_column(ForeignKey("gates.id", ondelete="CASCADE"), index=True)
    scenario: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    requests: Mapped[int] = mapped_column(Integer)
    columns: Mapped[bytes] = mapped_column(LargeBinary)

    gate: Mapped[GateRun] = relationship(back_populates="samples", lazy="raise")


class CheckResult(Base):
    __tablename__ = "checks"
    __table_args__ = (UniqueConstraint("gate_id", "check_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gate_id: Mapped[str] = mapped_column(ForeignKey("gates.id", ondelete="CASCADE"), index=True)
    check_id: Mapped[str] = mapped_column(String(200))
    group: Mapped[str] = mapped_column(String(32))
    scenario: Mapped[str | None] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(64))
    quantile: Mapped[float | None] = mapped_column(Float)
    reference: Mapped[float | None] = mapped_column(Float)
    candidate: Mapped[float | None] = mapped_column(Float)
    ratio: Mapped[float | None] = mapped_column(Float)
    interval_lo: Mapped[float | None] = mapped_column(Float)
    interval_hi: Mapped[float | None] = mapped_column(Float)
    threshold: Mapped[float | None] = mapped_column(Float)
    decision: Mapped[str] = mapped_column(String(16))
    samples_reference: Mapped[int] = mapped_column(Integer)
    samples_candidate: Mapped[int] = mapped_column(Integer)
    alpha: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text)

    gate: Mapped[GateRun] = relationship(back_populates="checks", lazy="raise")
