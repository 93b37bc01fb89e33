"""A live Kubernetes cluster as the reservation sees it: connecting to it, reaping the Leases
of gates that died without teardown (which frees the GPUs their pods held), and reading its GPU
nodes as the allocator's inventory, through the official client.

The client is imported inside the functions that use it: it takes a second to import, which
gates without a cluster skip.

GPU nodes are described by NVIDIA GPU Feature Discovery labels (`nvidia.com/gpu.product`,
`nvidia.com/gpu.memory` in MiB, `nvidia.com/gpu.count`, `nvidia.com/gpu.clique` on NVLink-fabric
racks such as GB200 NVL72) and the provider's topology labels (GKE's
`cloud.google.com/gce-topology-block` / `-subblock` / `-host`). Health is the Ready condition,
cordon is `spec.unschedulable`, and a taint counts only when the gate's pods do not tolerate it.
GPUs already requested by running or pending pods are subtracted as `allocated_gpus`.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gate.core.errors import ClusterError
from gate.reservations.inventory import Inventory, Node, load_inventory

if TYPE_CHECKING:
    from kubernetes import client

log = logging.getLogger(__name__)

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "llm-deploy-gate"

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


# -- connecting, reaping, reading the nodes -----------------------------------------------------


def transient_errors() -> tuple[type[BaseException], ...]:
    """What a call to the API server may raise that says nothing about the gate: the API's
    own errors, a dropped connection, a timeout."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    return (ApiException, urllib3.exceptions.HTTPError, OSError)


def api_reason(exc: BaseException) -> str:
    """An API error as one line: status, reason and the Status object's message."""
    from kubernetes.client.exceptions import ApiException

    if not isinstance(exc, ApiException):
        return f"{type(exc).__name__}: {exc}"
    message = ""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = body[:200]
    head = f"{exc.status} {exc.reason or ''}".strip()
    return f"{head}: {message}" if message else head


def connect(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool = False,
    retries: int | None = None,
) -> tuple[client.ApiClient, str]:
    """An API client for one cluster, and the cluster's name: the kubeconfig context's
    cluster, or `in-cluster` for the service account of the pod the gate runs in. Reads files
    only (no API call); the caller closes the client. `retries` bounds urllib3's retries of
    one call (None: urllib3's default of 3, so a call can take four times its timeout)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    cfg.retries = retries
    if in_cluster:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            raise ClusterError(f"cannot use the in-cluster service account: {exc}") from None
        return client.ApiClient(cfg), "in-cluster"
    path = str(Path(kubeconfig).expanduser()) if kubeconfig else None
    where = path or "(default: $KUBECONFIG or ~/.kube/config)"
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
        chosen = active
        if context is not None:
            chosen = next((c for c in contexts if c.get("name") == context), None)
            if chosen is None:
                known = ", ".join(str(c.get("name")) for c in contexts) or "none"
                raise ClusterError(
                    f"kubeconfig {where} has no context {context!r} (its contexts: {known})"
                )
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=cfg, persist_config=False
        )
        api_client = client.ApiClient(cfg)
    except (ConfigException, OSError, TypeError, ValueError, AttributeError) as exc:
        raise ClusterError(f"cannot use kubeconfig {where}: {exc}") from None
    spec = (chosen or {}).get("context") or {}
    return api_client, str(spec.get("cluster") or (chosen or {}).get("name") or "default")


def reap_expired_leases(
    api_client: client.ApiClient,
    namespace: str,
    *,
    now: datetime | None = None,
    grace_s: float = 30.0,
    timeout_s: float = 10.0,
) -> list[str]:
    """Delete the Leases of gates that stopped renewing them (crashed, killed, partitioned)
    more than `grace_s` ago; the garbage collector then removes their engines. Returns the
    names deleted. Synchronous: run it in a thread, e.g. when a gate service starts."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CoordinationV1Api(api_client)
    now = now or datetime.now(UTC)
    leases = api.list_namespaced_lease(
        namespace, label_selector=f"{MANAGED_BY_LABEL}={MANAGER}", _request_timeout=timeout_s
    )
    opts = client.V1DeleteOptions(propagation_policy="Background")
    reaped = []
    for lease in leases.items:
        spec = lease.spec or client.V1LeaseSpec()
        meta = lease.metadata or client.V1ObjectMeta()
        last = spec.renew_time or spec.acquire_time or meta.creation_timestamp
        if last is None or not meta.name:
            continue
        if last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        expiry = last + timedelta(seconds=(spec.lease_duration_seconds or 0) + grace_s)
        if expiry >= now:
            continue
        try:
            api.delete_namespaced_lease(meta.name, namespace, body=opts, _request_timeout=timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                continue  # gone already
            raise
        reaped.append(meta.name)
    return reaped


def reap_namespaces(api_client: client.ApiClient, namespaces: Iterable[str]) -> list[str]:
    """`reap_expired_leases` in each namespace, as housekeeping before a gate reserves: a
    failure (no RBAC to list Leases, a dropped connection) is logged, never fatal, since the
    gate's own Lease creation will say plainly what is wrong. Returns `namespace/name` of the
    Leases deleted."""
    out: list[str] = []
    for ns in sorted(set(namespaces)):
        try:
            reaped = reap_expired_leases(api_client, ns)
        except transient_errors() as exc:
            log.warning("could not reap expired gate Leases in %s: %s", ns, api_reason(exc))
            continue
        for name in reaped:
            log.info("reaped the expired Lease %s/%s of a gate that stopped renewing it", ns, name)
        out += [f"{ns}/{name}" for name in reaped]
    return out


def cluster_inventory(api_client: client.ApiClient, cluster: str) -> Inventory:
    """The cluster's GPU nodes for the allocator. GPUs of gate engine pods are not subtracted:
    the gates' reservations in the database count them (see `inventory_from_cluster`)."""
    from kubernetes import client

    try:
        return inventory_from_cluster(
            client.CoreV1Api(api_client),
            cluster=cluster,
            ignore_labels={MANAGED_BY_LABEL: MANAGER},
        )
    except transient_errors() as exc:
        raise ClusterError(
            f"could not read the nodes of cluster {cluster}: {api_reason(exc)}"
        ) from None


def gate_inventory(
    *,
    kubeconfig: str | None,
    context: str | None,
    in_cluster: bool,
    cluster: str | None,
    namespaces: Iterable[str],
    inventory_file: str | None = None,
) -> Inventory:
    """What a gate of Kubernetes engines reserves from: the cluster's GPU nodes (or the
    inventory file the spec names), after reaping the expired Leases of dead gates in the
    engines' namespaces, which frees the GPUs their pods held."""
    api_client, name = connect(kubeconfig=kubeconfig, context=context, in_cluster=in_cluster)
    with api_client:
        reap_namespaces(api_client, namespaces)
        if inventory_file:
            return load_inventory(inventory_file)
        return cluster_inventory(api_client, cluster or name)
