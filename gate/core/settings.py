"""Typed settings, read from GATE_* environment variables (and nothing at import time)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATE_", extra="ignore")

    data_dir: Path = Field(
        default=Path(".gate"),
        description="Where the embedded default keeps its SQLite file, reports and engine logs.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; unset means a SQLite file under data_dir.",
    )
    inventory: Path | None = Field(
        default=None,
        description="GPU inventory YAML; unset means the embedded local example inventory.",
    )
    lease_ttl_s: float = Field(default=600.0, gt=0, description="Reservation lease lifetime.")
    spec_dir: Path | None = Field(
        default=None,
        description="Named gate specs (NAME.yaml) that rollout controllers and webhooks may "
        "refer to by name instead of sending a whole spec.",
    )
    callback_token: str | None = Field(
        default=None, description="Bearer token sent with commit-status callbacks."
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker (Redis) URL; set, gate runs are Celery tasks executed by "
        "`gate worker` processes; unset, the API runs them in-process.",
    )
    local_gates: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Gates `gate serve` runs at once on its own threads (no broker set).",
    )
    heartbeat_s: float = Field(
        default=5.0, gt=0, description="How often a running gate writes its heartbeat."
    )
    lost_after_s: float = Field(
        default=30.0,
        gt=0,
        description="A running gate whose heartbeat is older than this has lost its worker: "
        "it ends in hold and its reservation is released.",
    )
    requeue_after_s: float = Field(
        default=60.0,
        gt=0,
        description="With a broker: a gate still pending this long whose task is neither in "
        "the queue nor held by a worker (the API died between storing and queueing it, or "
        "the broker lost it) is queued again by the reapers.",
    )
    broker_visibility_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Redis redelivers a gate task that no worker acknowledged within this "
        "many seconds (its worker died); a redelivered gate that was already claimed is a "
        "no-op, so this only bounds how long a gate whose worker died before claiming it "
        "stays pending.",
    )
    engines: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Engine templates API callers may name (`engine: NAME` with `params`), as "
        "JSON: {NAME: {engine: {...}, params: {...}}}; also GATE_SPEC_DIR/engines/NAME.yaml. "
        "A request can launch nothing else (gate/engines/templates.py).",
    )
    engine_url_allow: list[str] = Field(
        default_factory=list,
        description="Hosts a `url` engine may point to: host names, `.domain` suffixes, "
        "`host:port`, IP addresses or CIDR networks. Empty (the default): requests may name "
        "no URL; the command line also allows loopback. Link-local and cloud metadata "
        "addresses are refused whatever this says.",
    )
    image_allow: list[str] = Field(
        default_factory=list,
        description="Image repositories (exact, or prefixes ending in '/') a request may put "
        "in a named spec's kubernetes engine (`candidate_image`); the spec's own repository "
        "is always allowed (another tag or digest of the image the operator named).",
    )
    open_reads: bool = Field(
        default=False, description="Let requests without a token read gates and verdicts."
    )
    open_metrics: bool = Field(
        default=False,
        description="Let anyone scrape /metrics without a token (GATE_OPEN_METRICS). Off: "
        "/metrics needs a token with the read scope (Prometheus: `authorization: "
        "{credentials: <token>}`), unless open_reads opens every read.",
    )
    session_max_age_s: float = Field(
        default=12 * 3600.0,
        gt=0,
        le=7 * 86400.0,
        description="Lifetime of a report-page sign-in (a server-side session; the cookie "
        "carries only its secret). Signing out or revoking its token ends it sooner.",
    )
    webhook_secret: str | None = Field(
        default=None, description="HMAC-SHA256 secret of the CI webhook (unset: webhook off)."
    )
    webhook_max_age_s: float = Field(
        default=300.0, gt=0, description="Reject CI webhook deliveries older than this."
    )
    callback_allow: list[str] = Field(
        default_factory=list,
        description="URL prefixes a CI webhook may name as its commit-status callback.",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8080",
        description="Where the service is reachable, for report links in verdicts.",
    )
    max_body_bytes: int = Field(
        default=1_000_000, gt=0, description="Largest request body the API accepts."
    )

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'gate.db').resolve()}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
