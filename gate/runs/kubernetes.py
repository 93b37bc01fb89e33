"""The `kubernetes` engine kind: a Pod or LeaderWorkerSet per engine on the reserved nodes,
rendered from the spec (gate/engines/manifests.py), both engines of a gate under one client
and one Lease per namespace (gate/engines/kubernetes.py)."""

from __future__ import annotations

from collections.abc import Sequence

from gate.core.errors import EngineError
from gate.core.vocabulary import Role
from gate.engines import kubernetes as k8s
from gate.engines.launchers import Engine
from gate.engines.manifests import EngineWorkload
from gate.reservations.allocator import Placement
from gate.reservations.kubernetes import connect
from gate.runs.context import RunContext
from gate.spec import EngineSpec, KubernetesSpec


def workload(
    ctx: RunContext, role: Role, k: KubernetesSpec, placement: Placement
) -> EngineWorkload:
    """The engine's workload, every field from the spec's `kubernetes` section."""
    try:
        return EngineWorkload.from_placement(
            placement.for_role(role),
            namespace=k.namespace,
            gate_id=ctx.gate_id,
            image=k.image,
            model=ctx.spec.model,
            command=tuple(k.command),
            args=tuple(k.args),
            worker_command=None if k.worker_command is None else tuple(k.worker_command),
            worker_args=None if k.worker_args is None else tuple(k.worker_args),
            port=k.port,
            env=dict(k.env),
            secret_env={name: (r.secret, r.key) for name, r in k.secret_env.items()},
            tolerate=tuple(k.tolerate),
            cpu=k.cpu,
            memory=k.memory,
            shm_size=k.shm_size,
            image_pull_policy=k.image_pull_policy,
            image_pull_secrets=tuple(k.image_pull_secrets),
            service_account=k.service_account,
            health_path=k.health_path,
        )
    except ValueError as exc:
        raise EngineError(role, "launched", f"cannot be rendered: {exc}") from None


def kubernetes_engine(
    ctx: RunContext,
    role: Role,
    es: EngineSpec,
    placement: Placement,
    others: Sequence[Engine],
) -> k8s.KubernetesEngine:
    """One cluster per gate (the spec checks it): the first engine connects, the second
    shares its client, and its Lease when they share a namespace. The engine class is read
    from its module at each call, so a test can stand a reachable one in for it."""
    k = es.kubernetes
    assert k is not None
    pods = [e for e in others if isinstance(e, k8s.KubernetesEngine)]
    if pods:
        api_client = pods[0].api_client
    else:
        api_client, _ = connect(kubeconfig=k.kubeconfig, context=k.context, in_cluster=k.in_cluster)
    lease = next((e.lease for e in pods if e.workload.namespace == k.namespace), None)
    return k8s.KubernetesEngine(
        workload(ctx, role, k, placement),
        ctx.phase_log(role),
        api_client,
        lease=lease or k8s.GateLease(api_client, namespace=k.namespace, gate_id=ctx.gate_id),
        readiness_timeout_s=es.readiness_timeout_s,
    )
