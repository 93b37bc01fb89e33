"""The inventory of a live Kubernetes cluster, read through the official client.

GPU nodes are described by NVIDIA GPU Feature Discovery labels (`nvidia.com/gpu.product`,
`nvidia.com/gpu.memory` in MiB, `nvidia.com/gpu.count`, `nvidia.com/gpu.clique` on NVLink-fabric
racks such as GB200 NVL72) and the provider's topology labels (GKE's
`cloud.google.com/gce-topology-block` / `-subblock` / `-host`). Health is the Ready condition,
cordon is `spec.unschedulable`, and a taint counts only when the gate's pods do not tolerate it.
GPUs already requested by running or pending pods are subtracted as `allocated_gpus`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from gate.reservations.inventory import Inventory, Node

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
MEMORY_MIB = "nvidia.com/gpu.memory"
COUNT = "nvidia.com/gpu.count"
CLIQUE = "nvidia.com/gpu.clique"
TOPOLOGY_LABELS = {
    "block": ("cloud.google.com/gce-topology-block", "topology.gate.dev/block"),
    "subblock": ("cloud.google.com/gce-topology-subblock", "topology.gate.dev/subblock"),
    "host": ("cloud.google.com/gce-topology-host", "kubernetes.io/hostname"),
}
POOL_LABELS = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "node.kubernetes.io/instance-type",
)
DEFAULT_TOLERATED = ("nvidia.com/gpu",)


def _provider(provider_id: str | None) -> str:
    if not provider_id or "://" not in provider_id:
        return "unknown"
    return provider_id.split("://", 1)[0]


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def node_from_k8s(
    obj: Any,
    *,
    cluster: str,
    allocated: int = 0,
    tolerated: Iterable[str] = DEFAULT_TOLERATED,
) -> Node | None:
    """A V1Node -> our Node; None for a node with no GPUs."""
    labels: Mapping[str, str] = obj.metadata.labels or {}
    allocatable = (obj.status.allocatable or {}) if obj.status else {}
    gpus = _int(allocatable.get(GPU_RESOURCE)) or _int(labels.get(COUNT))
    if gpus <= 0:
        return None
    topology: dict[str, str] = {}
    for level, keys in TOPOLOGY_LABELS.items():
        for key in keys:
            if labels.get(key):
                topology[level] = labels[key]
                break
    if labels.get(CLIQUE):
        topology["clique"] = labels[CLIQUE]
    conditions = (obj.status.conditions or []) if obj.status else []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    tolerated_keys = set(tolerated)
    taints = [
        f"{t.key}={t.value or ''}:{t.effect}"
        for t in (obj.spec.taints or [] if obj.spec else [])
        if t.effect in ("NoSchedule", "NoExecute") and t.key not in tolerated_keys
    ]
    pool = next((labels[k] for k in POOL_LABELS if labels.get(k)), "default")
    return Node(
        name=obj.metadata.name,
        cluster=cluster,
        region=labels.get("topology.kubernetes.io/region", "unknown"),
        provider=_provider(obj.spec.provider_id if obj.spec else None),
        pool=pool,
        sku=labels.get(PRODUCT, "unknown"),
        gpu_memory_gib=max(_int(labels.get(MEMORY_MIB)) / 1024.0, 0.001),
        gpus=gpus,
        allocated_gpus=min(allocated, gpus),
        topology=topology,
        healthy=ready,
        cordoned=bool(obj.spec.unschedulable) if obj.spec else False,
        taints=taints,
    )


def gpu_requests_by_node(
    pods: Iterable[Any], ignore_labels: Mapping[str, str] | None = None
) -> dict[str, int]:
    """GPUs requested by pods that hold them (scheduled, not finished), except pods carrying
    every one of `ignore_labels`."""
    out: dict[str, int] = defaultdict(int)
    for pod in pods:
        node = pod.spec.node_name if pod.spec else None
        phase = pod.status.phase if pod.status else None
        if not node or phase in ("Succeeded", "Failed"):
            continue
        if ignore_labels:
            labels = (pod.metadata.labels if pod.metadata else None) or {}
            if all(labels.get(k) == v for k, v in ignore_labels.items()):
                continue
        for c in pod.spec.containers or []:
            req = (c.resources.requests or {}) if c.resources else {}
            lim = (c.resources.limits or {}) if c.resources else {}
            out[node] += _int(req.get(GPU_RESOURCE) or lim.get(GPU_RESOURCE))
    return dict(out)


def inventory_from_cluster(
    core: Any,
    *,
    cluster: str,
    label_selector: str | None = None,
    tolerated: Iterable[str] = DEFAULT_TOLERATED,
    ignore_labels: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Inventory:
    """Read nodes and GPU-holding pods from a cluster (`core` is a kubernetes CoreV1Api).

    `ignore_labels` leaves out the GPUs of pods that carry those labels: a gate passes its own
    managed-by label, because the GPUs of other gates' engine pods are already counted by their
    reservations in the database (counted twice, a node would look fuller than it is); the
    pods of a crashed gate go with its Lease, which `reap_expired_leases` collects."""
    nodes = core.list_node(label_selector=label_selector, _request_timeout=timeout_s).items
    pods = core.list_pod_for_all_namespaces(
        field_selector="status.phase!=Succeeded,status.phase!=Failed",
        _request_timeout=timeout_s,
    ).items
    used = gpu_requests_by_node(pods, ignore_labels)
    converted = [
        n
        for obj in nodes
        if (
            n := node_from_k8s(
                obj, cluster=cluster, allocated=used.get(obj.metadata.name, 0), tolerated=tolerated
            )
        )
        is not None
    ]
    if not converted:
        from gate.core.errors import ReservationError

        raise ReservationError(f"cluster {cluster} has no nodes with {GPU_RESOURCE} allocatable")
    return Inventory(name=f"k8s:{cluster}", nodes=converted)
