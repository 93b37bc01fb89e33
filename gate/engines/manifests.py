"""Kubernetes objects for one engine of a gate, rendered from a typed config (pure, no I/O).

What gets rendered, and why it looks the way it does:

- A `coordination.k8s.io/v1` **Lease** named after the gate is created first; every other
  object carries an ownerReference to it. Deleting the Lease (the gate's teardown), or a reaper
  deleting it once a crashed gate stopped renewing it, lets the garbage collector remove all of
  the gate's engines. The references set no `blockOwnerDeletion`: that would need `update` on
  `leases/finalizers` for foreground deletion, and the launcher deletes the objects itself and
  waits for the pods anyway.
- A **single-node engine is a bare Pod**, not a one-replica Deployment. A gate's engine lives
  for one run and must not be healed behind the gate's back: a ReplicaSet would replace an
  evicted or deleted pod with a fresh one (new name, restartCount 0), which hides exactly the
  crash the gate has to report. A bare Pod keeps its name (so status and logs are read by name),
  restarts its container in place (restartCount and lastState.terminated stay as evidence), and
  needs no RBAC on apps/v1.
- A **multi-node engine is a LeaderWorkerSet** (one group: `replicas: 1`, `size` = nodes per
  engine). `startupPolicy: LeaderCreated`, because multi-node servers (SGLang, vLLM over Ray)
  only answer /health once every rank has joined: with LeaderReady the workers would wait for
  a leader that waits for them. `restartPolicy: None` by default: a judge, not a healer,
  wants the restart evidence left on the pod that failed; RecreateGroupOnPodRestart (the LWS
  default) would delete the group and with it the OOMKilled status and previous log. The LWS
  pod webhook injects `LWS_LEADER_ADDRESS`, `LWS_GROUP_SIZE` and `LWS_WORKER_INDEX`, which argv
  items reference as `$(LWS_LEADER_ADDRESS)`: Kubernetes expands `$(VAR)` in command/args
  itself, so no shell is involved (e.g. SGLang's `--dist-init-addr $(LWS_LEADER_ADDRESS):20000
  --nnodes $(LWS_GROUP_SIZE) --node-rank $(LWS_WORKER_INDEX)`). vLLM's multi-node recipe runs a
  Ray head before `vllm serve` in one `sh -c`; that needs an image entrypoint doing both, since
  argv here is never a shell string.
- **Pinning**: the gate chose the nodes (its reservation is the source of truth), so each pod
  gets a required node affinity on `kubernetes.io/hostname`: the leader on the placement's first
  node, workers on the others, with a pod anti-affinity on the hostname so no two pods of one
  engine share a node. Where the placement's domain is an NVLink clique (GB200 NVL72), a
  nodeSelector on `nvidia.com/gpu.clique` states it too. The LWS exclusive-topology annotation is
  not used: it would repel the other engine from the clique, and both engines must share it.
  GPU indices of the reservation are bookkeeping only: inside a node the device plugin picks the
  devices, and the container sees them as 0..n-1.
- **ComputeDomain** (`resource.nvidia.com/v1beta1`, NVIDIA DRA driver) when an engine spans
  several nodes of a clique: it gives the pods an IMEX channel through the ResourceClaimTemplate
  it generates, which the pods reference. `numNodes` is the engine's node count: with the
  driver's DNS-name IMEX daemons (its default) the value only drives the domain's status; in the
  older mode it must equal the nodes that join, which it does.
- A ClusterIP **Service** `<engine>-http` selects the leader and exposes the port; the gate
  reaches the engine at `http://<service>.<namespace>.svc:<port>`. `publishNotReadyAddresses`
  lets the gate time port_open (the server bound its port) apart from healthy (/health 200):
  without it the Service has no endpoint until the readiness probe passes, and both phases
  would collapse into one. The readiness probe on /health still marks the pod Ready.
- Labels `app.kubernetes.io/managed-by: llm-deploy-gate`, `gate.dev/gate-id`, `gate.dev/role`
  (and `gate.dev/component: leader|worker`) select the engine's pods and find leftovers.
- `enableServiceLinks: false`: service-link variables such as `VLLM_PORT=tcp://...` (from any
  Service named `vllm` in the namespace) are known to break engines that read their own
  `*_PORT` variables; `automountServiceAccountToken: false`: engines never call the API.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from gate.reservations.allocator import EnginePlacement
from gate.reservations.kubernetes import CLIQUE, DEFAULT_TOLERATED, GPU_RESOURCE
from gate.reservations.kubernetes import MANAGED_BY_LABEL as MANAGED_BY_LABEL
from gate.reservations.kubernetes import MANAGER as MANAGER

Manifest = dict[str, Any]

GATE_ID_LABEL = "gate.dev/gate-id"
ROLE_LABEL = "gate.dev/role"
GROUP_LABEL = "gate.dev/group"
ROUTER = "router"
COMPONENT_LABEL = "gate.dev/component"
HOSTNAME_LABEL = "kubernetes.io/hostname"

LEASE_API_VERSION = "coordination.k8s.io/v1"
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
CD_GROUP, CD_VERSION, CD_PLURAL = "resource.nvidia.com", "v1beta1", "computedomains"

CONTAINER = "engine"
PORT_NAME = "http"
IMEX_CLAIM = "imex-channel"
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh"})

LwsRestartPolicy = Literal["None", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart"]

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1123, as namespaces
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SHORT_ID = 12


def dns_part(text: str) -> str:
    """Lower-case letters, digits and '-' only, so any gate id or role can be part of a name."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def lease_name(gate_id: str) -> str:
    return f"gate-{dns_part(gate_id)}"[:63].rstrip("-")


def engine_name(gate_id: str, role: str, group: str | None = None) -> str:
    """Short enough for LWS's derived names (`<name>-0-3`, StatefulSet revision labels): at
    most 44 characters with a group (16 at most, spec.GROUP_ROLE_RE), 50 with `-imex-channel`
    from its longest derived name, 63 being the limit."""
    base = f"gate-{dns_part(gate_id)[:_SHORT_ID].rstrip('-')}-{dns_part(role)[:10].strip('-')}"
    return f"{base}-{dns_part(group)[:16].strip('-')}" if group else base


def service_name(gate_id: str, role: str, group: str | None = None) -> str:
    # Not the engine's own name: LeaderWorkerSet creates a headless Service of that name.
    return f"{engine_name(gate_id, role, group)}-http"


def compute_domain_name(gate_id: str, role: str, group: str | None = None) -> str:
    return f"{engine_name(gate_id, role, group)}-imex"


def claim_template_name(gate_id: str, role: str, group: str | None = None) -> str:
    return f"{engine_name(gate_id, role, group)}-imex-channel"


def gate_labels(gate_id: str) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGER, GATE_ID_LABEL: gate_id}


def engine_labels(gate_id: str, role: str, group: str | None = None) -> dict[str, str]:
    labels = {**gate_labels(gate_id), ROLE_LABEL: role}
    if group is not None:
        labels[GROUP_LABEL] = group
    return labels


def pod_selector(gate_id: str, role: str, group: str | None = None) -> str:
    """The label selector of every pod of one engine (leader and workers), or of one of its
    worker groups (or its router)."""
    return ",".join(f"{k}={v}" for k, v in engine_labels(gate_id, role, group).items())


def clique_of(domain: str) -> str | None:
    """The `nvidia.com/gpu.clique` value of an allocator domain such as `dfw-1/clique=7f3a.0`."""
    _, sep, value = domain.partition("/clique=")
    return value if sep and value else None


def check_argv(argv: tuple[str, ...], what: str) -> None:
    """Reject shell strings: an engine's argv is exec'd as given, never parsed by a shell."""
    if not argv:
        return
    program = argv[0].rsplit("/", 1)[-1]
    if program in SHELLS and any(a in ("-c", "-lc", "-ec") for a in argv[1:]):
        raise ValueError(f"{what}: give an argv list, never a shell string ({argv[0]} -c ...)")
    if not argv[0].strip() or any(ch.isspace() for ch in argv[0]):
        raise ValueError(
            f"{what}: the program {argv[0]!r} looks like a command line; split it into argv items"
        )


@dataclass(frozen=True)
class EngineWorkload:
    """One engine to run on the nodes the gate reserved.

    `command` replaces the image's entrypoint and `args` its arguments (empty: the image's
    own); workers of a multi-node engine run `worker_command`/`worker_args`, by default the
    leader's (SGLang's ranks all run the same argv). Placeholders, filled by plain replacement:
    `{port}`, `{host}` (0.0.0.0), `{model}`, `{tp}` (GPUs per node, as for local engines),
    `{gpus}` (the container's device indices), `{nodes}`, `{total_gpus}`, and any
    `extra_placeholders` (a worker group's `{role}`, `{url:decode}`...).

    `group` makes this one worker group of an engine of several (or, as `router`, the
    engine's router): its objects are named `<engine>-<group>` and labelled `gate.dev/group`.
    `gpus_per_node: 0` is only for the router: a pod without GPUs, on one node.
    """

    namespace: str
    gate_id: str
    role: str
    image: str
    model: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    worker_command: tuple[str, ...] | None = None
    worker_args: tuple[str, ...] | None = None
    port: int = 8000
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    clique: str | None = None
    tolerate: tuple[str, ...] = DEFAULT_TOLERATED
    cpu: str | None = None
    memory: str | None = None
    shm_size: str | None = "16Gi"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str | None = None
    lws_restart_policy: LwsRestartPolicy = "None"
    termination_grace_s: int = 30
    health_path: str = "/health"
    group: str | None = None
    extra_placeholders: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.namespace):
            raise ValueError(f"namespace {self.namespace!r} is not a DNS-1123 label")
        if not self.gate_id or not _LABEL_VALUE.match(self.gate_id) or len(self.gate_id) > 63:
            raise ValueError(f"gate id {self.gate_id!r} cannot be a label value")
        if not dns_part(self.role) or not _LABEL_VALUE.match(self.role):
            raise ValueError(f"role {self.role!r} cannot be a label value")
        if not self.image.strip():
            raise ValueError("image must not be empty")
        if not self.nodes or len(set(self.nodes)) != len(self.nodes):
            raise ValueError("nodes: give each reserved node once, the leader's first")
        if self.group is not None and (
            not dns_part(self.group) or not _LABEL_VALUE.match(self.group)
        ):
            raise ValueError(f"group {self.group!r} cannot be a label value")
        router = self.group == ROUTER and not self.multi_node
        if self.gpus_per_node < 1 and not (router and self.gpus_per_node == 0):
            raise ValueError("gpus_per_node must be at least 1 (0: only for a router)")
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is out of range")
        if not self.command and not self.args:
            raise ValueError(
                "give command and/or args (the image's entrypoint alone is not enough)"
            )
        check_argv(self.command, "command")
        if self.worker_command is not None:
            check_argv(self.worker_command, "worker_command")
        for name in (*self.env, *self.secret_env):
            if not _ENV_NAME.match(name):
                raise ValueError(f"env name {name!r} is not valid")

    @classmethod
    def from_placement(
        cls,
        placement: EnginePlacement,
        *,
        namespace: str,
        gate_id: str,
        image: str,
        model: str,
        **options: Any,
    ) -> EngineWorkload:
        """From the allocator's answer: its nodes (leader first), GPUs per node, and the clique
        when the engine's domain is one."""
        return cls(
            namespace=namespace,
            gate_id=gate_id,
            role=placement.role,
            image=image,
            model=model,
            nodes=tuple(node for node, _ in placement.nodes),
            gpus_per_node=len(placement.nodes[0][1]),
            clique=options.pop("clique", None) or clique_of(placement.domain),
            **options,
        )

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    @property
    def name(self) -> str:
        return engine_name(self.gate_id, self.role, self.group)

    @property
    def service(self) -> str:
        return service_name(self.gate_id, self.role, self.group)

    @property
    def labels(self) -> dict[str, str]:
        return engine_labels(self.gate_id, self.role, self.group)

    @property
    def selector(self) -> str:
        return pod_selector(self.gate_id, self.role, self.group)

    def service_url(self, cluster_domain: str | None = None) -> str:
        suffix = f".{cluster_domain}" if cluster_domain else ""
        return f"http://{self.service}.{self.namespace}.svc{suffix}:{self.port}"

    @property
    def needs_compute_domain(self) -> bool:
        """IMEX is only needed across nodes; NVLink inside one node works without it."""
        return self.clique is not None and self.multi_node

    def placeholders(self) -> dict[str, str]:
        return {
            "port": str(self.port),
            "host": "0.0.0.0",
            "model": self.model,
            "tp": str(self.gpus_per_node),
            "gpus": ",".join(str(i) for i in range(self.gpus_per_node)),
            "nodes": str(len(self.nodes)),
            "total_gpus": str(self.gpus_per_node * len(self.nodes)),
            **self.extra_placeholders,
        }


@dataclass(frozen=True, slots=True)
class EngineManifests:
    """The engine's objects besides the Lease, in the order they are created."""

    workload: Manifest  # a Pod (single node) or a LeaderWorkerSet (several nodes)
    service: Manifest
    compute_domain: Manifest | None = None

    @property
    def objects(self) -> tuple[Manifest, ...]:
        # The ComputeDomain first, so its claim template exists by the time pods reference it.
        head = (self.compute_domain,) if self.compute_domain is not None else ()
        return (*head, self.service, self.workload)


def fill(argv: tuple[str, ...], values: Mapping[str, str]) -> list[str]:
    """Plain replacement of `{name}`: no format(), no shell; `$(VAR)` is left for Kubernetes."""
    out = []
    for item in argv:
        for key, val in values.items():
            item = item.replace("{" + key + "}", val)
        out.append(item)
    return out


def micro_time(at: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def render_lease(
    *, namespace: str, gate_id: str, holder: str, duration_s: int, now: datetime, name: str = ""
) -> Manifest:
    """The gate's Lease: the owner of everything else, renewed while the gate lives."""
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": {
            "name": name or lease_name(gate_id),
            "namespace": namespace,
            "labels": gate_labels(gate_id),
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
        },
    }


def owner_reference(lease: str, lease_uid: str) -> dict[str, Any]:
    return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "name": lease, "uid": lease_uid}


def _metadata(cfg: EngineWorkload, name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": cfg.namespace,
        "labels": cfg.labels,
        "ownerReferences": [owner],
    }


def _container(
    cfg: EngineWorkload, command: tuple[str, ...], args: tuple[str, ...], *, leader: bool
) -> dict[str, Any]:
    values = cfg.placeholders()
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(cfg.env.items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for k, (secret, key) in sorted(cfg.secret_env.items())
    ]
    limits: dict[str, str] = {GPU_RESOURCE: str(cfg.gpus_per_node)} if cfg.gpus_per_node else {}
    requests: dict[str, str] = {}
    if cfg.cpu:
        requests["cpu"] = cfg.cpu
    if cfg.memory:
        requests["memory"] = limits["memory"] = cfg.memory
    resources: dict[str, Any] = {"limits": limits} if limits else {}
    if requests:
        resources["requests"] = requests
    if cfg.needs_compute_domain:
        resources["claims"] = [{"name": IMEX_CLAIM}]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
    }
    if command:
        container["command"] = fill(command, values)
    if args:
        container["args"] = fill(args, values)
    if env:
        container["env"] = env
    container["resources"] = resources
    if leader:
        container["ports"] = [{"name": PORT_NAME, "containerPort": cfg.port, "protocol": "TCP"}]
        container["readinessProbe"] = {
            "httpGet": {"path": cfg.health_path, "port": PORT_NAME},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        }
    if cfg.shm_size:
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    return container


def _pod_spec(
    cfg: EngineWorkload,
    nodes: tuple[str, ...],
    command: tuple[str, ...],
    args: tuple[str, ...],
    *,
    leader: bool,
) -> dict[str, Any]:
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}
                        ]
                    }
                ]
            }
        }
    }
    if cfg.multi_node:
        affinity["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": cfg.labels},
                    "topologyKey": HOSTNAME_LABEL,
                }
            ]
        }
    spec: dict[str, Any] = {
        "containers": [_container(cfg, command, args, leader=leader)],
        "affinity": affinity,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": cfg.termination_grace_s,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
    }
    if cfg.clique:
        spec["nodeSelector"] = {CLIQUE: cfg.clique}
    if cfg.tolerate:
        spec["tolerations"] = [{"key": key, "operator": "Exists"} for key in cfg.tolerate]
    if cfg.service_account:
        spec["serviceAccountName"] = cfg.service_account
    if cfg.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in cfg.image_pull_secrets]
    if cfg.shm_size:
        spec["volumes"] = [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": cfg.shm_size}}
        ]
    if cfg.needs_compute_domain:
        spec["resourceClaims"] = [
            {
                "name": IMEX_CLAIM,
                "resourceClaimTemplateName": claim_template_name(cfg.gate_id, cfg.role, cfg.group),
            }
        ]
    return spec


def _template_labels(cfg: EngineWorkload, component: str) -> dict[str, str]:
    return {**cfg.labels, COMPONENT_LABEL: component}


def render_pod(cfg: EngineWorkload, owner: dict[str, Any]) -> Manifest:
    meta = _metadata(cfg, cfg.name, owner)
    meta["labels"] = _template_labels(cfg, "leader")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": _pod_spec(cfg, cfg.nodes, cfg.command, cfg.args, leader=True),
    }


def render_leader_worker_set(cfg: EngineWorkload, owner: dict[str, Any]) -> Manifest:
    worker_command = cfg.command if cfg.worker_command is None else cfg.worker_command
    worker_args = cfg.args if cfg.worker_args is None else cfg.worker_args
    leader_spec = _pod_spec(cfg, cfg.nodes[:1], cfg.command, cfg.args, leader=True)
    worker_spec = _pod_spec(cfg, cfg.nodes[1:], worker_command, worker_args, leader=False)
    return {
        "apiVersion": f"{LWS_GROUP}/{LWS_VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": _metadata(cfg, cfg.name, owner),
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": len(cfg.nodes),
                "restartPolicy": cfg.lws_restart_policy,
                "leaderTemplate": {
                    "metadata": {"labels": _template_labels(cfg, "leader")},
                    "spec": leader_spec,
                },
                "workerTemplate": {
                    "metadata": {"labels": _template_labels(cfg, "worker")},
                    "spec": worker_spec,
                },
            },
        },
    }


def render_service(cfg: EngineWorkload, owner: dict[str, Any]) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(cfg, cfg.service, owner),
        "spec": {
            "type": "ClusterIP",
            "selector": _template_labels(cfg, "leader"),
            "ports": [
                {"name": PORT_NAME, "port": cfg.port, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
            "publishNotReadyAddresses": True,
        },
    }


def render_compute_domain(cfg: EngineWorkload, owner: dict[str, Any]) -> Manifest:
    return {
        "apiVersion": f"{CD_GROUP}/{CD_VERSION}",
        "kind": "ComputeDomain",
        "metadata": _metadata(cfg, compute_domain_name(cfg.gate_id, cfg.role, cfg.group), owner),
        "spec": {
            "numNodes": len(cfg.nodes),
            "channel": {
                "resourceClaimTemplate": {
                    "name": claim_template_name(cfg.gate_id, cfg.role, cfg.group)
                },
                "allocationMode": "Single",
            },
        },
    }


def render_engine(cfg: EngineWorkload, *, lease: str, lease_uid: str) -> EngineManifests:
    """Everything one engine needs, owned by the gate's Lease (whose uid exists only once the
    Lease was created, hence the two steps)."""
    owner = owner_reference(lease, lease_uid)
    workload = render_leader_worker_set(cfg, owner) if cfg.multi_node else render_pod(cfg, owner)
    return EngineManifests(
        workload=workload,
        service=render_service(cfg, owner),
        compute_domain=render_compute_domain(cfg, owner) if cfg.needs_compute_domain else None,
    )
