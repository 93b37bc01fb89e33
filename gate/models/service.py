"""What the service keeps beside gates: API tokens (hashed), the pages' sign-in sessions
(hashed), webhook deliveries seen, and verdict alerts owed and sent."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy import false as sa_false
from sqlalchemy.orm import Mapped, mapped_column

from gate.models.base import Base, utcnow


class ApiToken(Base):
    """A bearer token; only its SHA-256 is stored, the token itself is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(100))  # comma-separated: read,run,admin
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebSession(Base):
    """A signed-in browser (gate/access/sessions.py). The cookie carries a random secret; only
    its SHA-256 is stored. The session has at most its token's scopes (read unless the sign-in
    asked for run) and ends when it expires, signs out, or its token is revoked."""

    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[int] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True
    )
    scopes: Mapped[str] = mapped_column(String(100))  # comma-separated, as ApiToken.scopes
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookDelivery(Base):
    """One accepted webhook delivery: a redelivery of the same id returns the same gate."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)  # source:delivery-id
    source: Mapped[str] = mapped_column(String(16))
    body_sha256: Mapped[str] = mapped_column(String(64))
    gate_id: Mapped[str | None] = mapped_column(ForeignKey("gates.id", ondelete="SET NULL"))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AlertDelivery(Base):
    """One verdict alert of one gate to one target (gate/service/alerts.py): planned when the
    gate is created, sent once it ends (if its verdict is one the target hears), retried by
    the reapers a bounded number of times. `url` is a spec's own URL; an operator's target
    (`target` its name) is looked up when sent, so its secret URL is never stored per gate."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (UniqueConstraint("gate_id", "target"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gate_id: Mapped[str] = mapped_column(ForeignKey("gates.id", ondelete="CASCADE"), index=True)
    target: Mapped[str] = mapped_column(String(48))  # an operator's name, or notify[i]
    url: Mapped[str | None] = mapped_column(String(500))
    format: Mapped[str] = mapped_column(String(8))
    on: Mapped[str] = mapped_column(String(8))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    posts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    tried_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    done: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    last_status: Mapped[int | None] = mapped_column(Integer)
    result: Mapped[str | None] = mapped_column(String(200))
