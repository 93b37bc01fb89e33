"""Typed settings, read from GATE_* environment variables (and nothing at import time)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gate.core.limits import Caps

AlertFormat = Literal["slack", "json"]
AlertOn = Literal["hold", "all"]
MAX_ALERT_TARGETS = 16


class AlertTarget(BaseModel):
    """An operator's alert target (GATE_ALERT_TARGETS): where verdicts are posted, in which
    format, for which verdicts; `every_gate` false makes it one a spec must name in `notify`.
    The URL is the operator's and never leaves the service (a Slack webhook URL is a secret)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$")
    url: str = Field(min_length=8, max_length=2000)
    format: AlertFormat = "json"
    on: AlertOn = "hold"
    every_gate: bool = True


class Settings(BaseSettings, Caps):
    """The service's settings; the caps on what one spec may make the gate spend are `Caps`'
    fields (gate/core/limits.py), declared there once."""

    model_config = SettingsConfigDict(env_prefix="GATE_", extra="ignore")

    data_dir: Path = Field(
        default=Path(".gate"),
        description="Where the embedded default keeps its SQLite file, and where reports "
        "(reports/), engine logs (logs/<gate id>/) and worker health files (workers/) go.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; unset means a SQLite file under data_dir.",
    )
    inventory: Path | None = Field(
        default=None,
        description="GPU inventory YAML; unset means the embedded local example inventory. The "
        "API and every worker must name the same file: leases are keyed by its name.",
    )
    lease_ttl_s: float = Field(
        default=600.0,
        gt=0,
        description="Reservation lease lifetime, renewed every sixth of it; a gate that cannot "
        "renew it for this less its teardown margin (max(0.25 x TTL, min(20 s, 0.4 x TTL))) "
        "stops its engines and ends `lease_lost`.",
    )
    spec_dir: Path | None = Field(
        default=None,
        description="Named gate specs (NAME.yaml) that rollout controllers and webhooks may "
        "refer to by name instead of sending a whole spec.",
    )
    workload_dir: Path | None = Field(
        default=None,
        description="The only directory workload files are read from (a scenario's "
        "`workload.file`, a path relative to it; docs/workloads.md). Unset: the API refuses "
        "every workload file, and `gate run` reads them relative to its working directory.",
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
        description="A running gate whose heartbeat is older than this, and (with a broker) "
        "whose proof-of-life key in the broker, which lives this long, has expired too, has "
        "lost its worker: it ends in hold (`worker_lost`) and its reservation is released.",
    )
    state_write_retry_s: float = Field(
        default=900.0,
        gt=0,
        description="How long a gate keeps retrying a write of its state (its phases, its "
        "finished record, the release of its GPUs) while the database is unreachable; every "
        "failure is logged.",
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
        "A request can launch nothing else (gate/service/engine_templates.py).",
    )
    gpu_telemetry: Literal["auto", "nvml", "nvidia-smi", "off"] = Field(
        default="auto",
        description="How a process engine's reserved GPUs are read during load scenarios (at "
        "the spec's `telemetry.interval_s`, beside the engines' metrics): `auto` tries NVML "
        "(nvidia-ml-py) and then `nvidia-smi` on PATH; `off` reads none. Where none can be "
        "read, one note in the verdict says so and the gate carries on.",
    )
    dcgm_url: str | None = Field(
        default=None,
        description="The DCGM exporter's metrics URL for Kubernetes engines' GPUs, e.g. "
        "`http://{node}:9400/metrics` (`{node}`: read once per reserved node, an exporter per "
        "node) or one URL that serves every node's GPUs. Unset: their GPUs are not read.",
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
    flagger_cluster: str | None = Field(
        default=None,
        description="Where Flagger's canaries live, for the Flagger hooks to read what is "
        "rolled out: `in-cluster` (the service account of the gate's pod) or a kubeconfig "
        "path. Unset: the hooks read nothing from a cluster and the candidate is what the "
        "hook's metadata names.",
    )
    flagger_context: str | None = Field(
        default=None,
        description="The kubeconfig context of GATE_FLAGGER_CLUSTER (default: its own).",
    )
    flagger_namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces whose Canaries the Flagger hooks may read (exact names). Empty "
        "(the default): none, so a cluster must be opened namespace by namespace.",
    )
    flagger_annotate: bool = Field(
        default=False,
        description="Write the gate's verdict, reason and report link on the Canary's "
        "annotations (`llm-deploy-gate.io/*`) and a Warning Event on a hold, so a held rollout "
        "shows in `kubectl describe canary`. Needs patch on canaries and create on events.",
    )
    flagger_budget_s: float = Field(
        default=8.0,
        gt=0.0,
        le=300.0,
        description="Seconds within which all the cluster calls of one Flagger hook end (a "
        "slower cluster is a 502, which Flagger takes as no and asks again): keep it under "
        "the hooks' `timeout` in the Canary (Flagger's default 10 s).",
    )
    max_active_gates_per_token: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description="Pending and running gates one token (or the CI webhook) may have at once: "
        "past it, a new gate is refused (429) so that one caller cannot take every GPU and "
        "hold everyone else's rollouts by starving them.",
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
    alert_targets: list[AlertTarget] = Field(
        default_factory=list,
        max_length=MAX_ALERT_TARGETS,
        description="Verdict alerts (JSON list): each {name, url, format: slack|json, on: "
        "hold|all, every_gate}; every_gate targets get every gate's verdict, the others only "
        "a spec's that names them in `notify`.",
    )
    alert_allow: list[str] = Field(
        default_factory=list,
        description="URL prefixes a spec's `notify` may name directly (as GATE_CALLBACK_ALLOW); "
        "empty: specs may only name GATE_ALERT_TARGETS.",
    )
    alert_secret: str | None = Field(
        default=None,
        description="Signs `json` alerts: X-Hub-Signature-256, HMAC-SHA256 of the body.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="`gate serve`: a request's line and headers must arrive within this, from "
        "the connection's opening or the request's first byte; past it, 408 and the "
        "connection is closed (a client trickling its head holds nothing longer).",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="`gate serve`: a request's whole body must arrive within this after its "
        "head (time the server was not reading does not count); past it, 408 and closed.",
    )
    keep_alive_s: float = Field(
        default=5.0,
        ge=1,
        le=3600,
        description="`gate serve`: an idle connection between requests is closed after this "
        "(uvicorn's timeout_keep_alive, whole seconds).",
    )
    max_connections: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="`gate serve`: open connections at most (and at most half the process's "
        "open-file limit); one past it gets 503 and is closed at once.",
    )
    max_connections_per_client: int = Field(
        default=32,
        ge=0,
        le=100_000,
        description="`gate serve`: open connections from one client address at most (0: no "
        "such cap); one past it gets 503 and is closed at once. Behind a reverse proxy every "
        "connection is the proxy's: set it to 0 and cap clients at the proxy.",
    )
    public_url: str = Field(
        default="http://127.0.0.1:8080",
        description="Where the service is reachable: the start of report links in verdicts "
        "and commit statuses (the default points at 127.0.0.1), Secure cookies, the pages' "
        "Origin check.",
    )
    max_body_bytes: int = Field(
        default=1_000_000, gt=0, description="Largest request body the API accepts."
    )
    max_answer_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=65_536,
        description="Largest answer the service writes (an error answer: at most 64 KiB); a "
        "larger one is replaced by a 500 `answer_too_large` and logged (gate.http.problems).",
    )
    api_docs: bool = Field(
        default=True,
        description="Serve the API docs page (/v1/docs) and the OpenAPI document "
        "(/v1/openapi.json) to anyone; false answers 404 for both.",
    )

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'gate.db').resolve()}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
