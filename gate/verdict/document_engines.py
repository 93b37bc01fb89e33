"""The verdict document's engines (document.py): how each was run and where (process,
endpoint or Kubernetes; its placement and worker groups), its startup, crash and capabilities,
the test bed it ran on, and the reservation that held its GPUs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gate.core.vocabulary import Role
from gate.verdict.document_base import _Doc

__all__ = [
    "CapabilitiesDoc",
    "CrashDoc",
    "EngineDoc",
    "EngineSoftwareDoc",
    "GpuDoc",
    "GroupDoc",
    "GroupPlacementDoc",
    "KubernetesDoc",
    "NodeGpus",
    "PlacementDoc",
    "PlatformDoc",
    "ReservationBlocked",
    "ReservationReleased",
]


class NodeGpus(_Doc):
    node: str
    gpus: list[int]


class GroupPlacementDoc(_Doc):
    """One worker group of an engine of several (prefill, decode): its nodes and GPUs."""

    role: str
    nodes: list[NodeGpus]
    sku: str | None = None
    domain: str | None = None


class PlacementDoc(_Doc):
    """Where an engine the gate launched ran. Kubernetes engines also name every node and the
    topology domain their GPUs share; an engine of several worker groups names each group's
    (`node` and `gpus` are then its first group's leader)."""

    node: str
    gpus: list[int]
    sku: str | None = None
    nodes: list[NodeGpus] | None = None
    domain: str | None = None
    groups: list[GroupPlacementDoc] | None = None


class GroupDoc(_Doc):
    """One process of an engine of several worker groups: a group's worker or the router."""

    role: str = Field(description="the group (prefill, decode) or `router`")
    url: str | None = None
    pid: int | None = None
    node: str | None = None
    gpus: list[int] = Field(default_factory=list)
    phases: dict[str, float] = Field(default_factory=dict)
    crashed: bool = False
    log: str | None = None
    log_tail: list[str] = Field(default_factory=list)


class KubernetesDoc(_Doc):
    namespace: str
    image: str
    workload: str = Field(description="Pod NAME or LeaderWorkerSet NAME")
    clique: str | None = None
    service_url: str | None = None
    lease: str | None = Field(None, description="the gate's Lease that owns every object")
    objects: list[str] = Field(default_factory=list, description="KIND namespace/name")


class CrashDoc(_Doc):
    at_s: float = Field(description="seconds into the gate")
    exit_code: int | None = None
    description: str
    log_tail: list[str] = Field(default_factory=list)


class CapabilitiesDoc(_Doc):
    """What the engine answered when asked at readiness (loadgen/capabilities.py)."""

    completions: bool = False
    chat: bool = False
    logprobs: bool = False
    top_logprobs_max: int | None = None
    prompt_logprobs: bool = False
    token_ids: bool = False
    prompt_token_ids: bool = False
    stream_usage: bool = False
    problems: list[str] = Field(default_factory=list, description="what each failed ask said")
    tokens_by_id: bool = Field(
        default=False,
        description="asked with vLLM's return_tokens_as_token_ids, it named tokens by id",
    )


class EngineDoc(_Doc):
    """One engine as the gate saw it: how it was run, its startup phases, a crash, its log."""

    kind: Literal["process", "endpoint", "kubernetes"]
    url: str | None = None
    pid: int | None = None
    placement: PlacementDoc | None = None
    kubernetes: KubernetesDoc | None = None
    phases: dict[str, float] = Field(
        default_factory=dict, description="phase -> seconds into the gate it was reached"
    )
    ready_s: float | None = Field(None, description="launch to ready; null for attached ones")
    launch_host_busy: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="the share of the gate host's CPUs that other work than the gate's engines "
        "kept busy during this engine's launch (its start); null: not measured (not a process "
        "here)",
    )
    launch_cpu_wait_s: float | None = Field(
        None,
        ge=0.0,
        description="the longest any thread of this engine waited for a CPU during its launch "
        "(its start), seconds; null: not measured (not a process here, or no schedstats)",
    )
    crash: CrashDoc | None = None
    log: str | None = Field(None, description="the engine's log file (process engines)")
    log_tail: list[str] = Field(default_factory=list)
    capabilities: CapabilitiesDoc | None = Field(
        None, description="learned at readiness; null when the gate did not get that far"
    )
    groups: list[GroupDoc] | None = Field(
        None, description="an engine of several worker groups: each group and its router"
    )


class EngineSoftwareDoc(_Doc):
    """What one engine ran, as far as the gate could see: the version it answered on
    `/version` (vLLM's and the sim's, `{"version": ...}`), and for a Kubernetes engine the
    image and the digest the kubelet reported (`imageID`)."""

    version: str | None = Field(None, description="what GET /version answered; null: no answer")
    version_note: str | None = Field(None, description="why there is no version")
    program: str | None = Field(
        None, description="a process engine's program or preset (argv[0], `preset:vllm`)"
    )
    image: str | None = None
    image_digest: str | None = Field(None, description="the running container's imageID")


class GpuDoc(_Doc):
    model: str
    driver: str | None = None
    memory_mib: int | None = None


class PlatformDoc(_Doc):
    """The hardware and software a gate ran on, so the history can tell a test bed that
    changed from software that did. GPUs are the gate host's as `nvidia-smi` lists them;
    none listed says why (`gpu_note`, e.g. not visible: no nvidia-smi on this host)."""

    host: str
    gate_version: str
    python: str
    platform: str
    gpus: list[GpuDoc] = Field(default_factory=list)
    gpu_note: str | None = None
    engines: dict[Role, EngineSoftwareDoc] = Field(default_factory=dict)
    identity: str | None = Field(
        None, description="the spec's identity (name, model, shape) its history is kept by"
    )
    aa: bool | None = Field(
        None,
        description="an A/A gate: both engines specified alike (same argv, preset, image, url)",
    )


class ReservationReleased(_Doc):
    """The GPUs the gate held. `lost`: the lease ended while the gate held it (it could not
    be renewed, or was reaped): the gate stopped its engines, and says why here."""

    state: Literal["released", "lost"]
    id: int
    fence: int = Field(description="the fence token: reservation ids only ever grow")
    placement: dict[str, Any] = Field(description="every engine's node, GPUs and domain")
    lost: str | None = None


class ReservationBlocked(_Doc):
    """Nothing fitted: the first layer that left nothing, and what each layer removed."""

    state: Literal["blocked"]
    code: str
    message: str
    retryable: bool
    eliminated: dict[str, int] = Field(default_factory=dict)
    per_domain: list[dict[str, Any]] = Field(default_factory=list)
