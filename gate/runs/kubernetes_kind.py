"""The `kubernetes` engine kind: a Pod or LeaderWorkerSet per engine on the reserved nodes,
rendered from the spec (gate/engines/manifests.py), both engines of a gate under one client
and one Lease per namespace (gate/engines/kubernetes.py, gate/engines/gate_lease.py); on a
shape with worker groups, one per group plus a router pod (gate/engines/kubernetes_groups.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gate.core.errors import EngineError
from gate.core.vocabulary import Role
from gate.engines import kubernetes as k8s
from gate.engines import kubernetes_groups as k8s_groups
from gate.engines.gate_lease import GateLease
from gate.engines.launchers import Engine
from gate.engines.manifests import ROUTER, EngineWorkload, clique_of
from gate.reservations.allocator import EnginePlacement, Placement
from gate.reservations.kubernetes import connect
from gate.runs.context import RunContext
from gate.spec import EngineSpec, KubernetesSpec


def _options(k: KubernetesSpec) -> dict[str, Any]:
    """The workload fields every member of an engine takes from its `kubernetes` section."""
    return {
        "namespace": k.namespace,
        "port": k.port,
        "secret_env": {name: (r.secret, r.key) for name, r in k.secret_env.items()},
        "tolerate": tuple(k.tolerate),
        "image_pull_policy": k.image_pull_policy,
        "image_pull_secrets": tuple(k.image_pull_secrets),
        "service_account": k.service_account,
    }


def _argv(v: list[str] | None) -> tuple[str, ...] | None:
    return None if v is None else tuple(v)


def workload(
    ctx: RunContext, role: Role, k: KubernetesSpec, placement: Placement
) -> EngineWorkload:
    """The engine's workload, every field from the spec's `kubernetes` section."""
    try:
        return EngineWorkload.from_placement(
            placement.for_role(role),
            gate_id=ctx.gate_id,
            image=k.image,
            model=ctx.spec.model,
            command=tuple(k.command),
            args=tuple(k.args),
            worker_command=_argv(k.worker_command),
            worker_args=_argv(k.worker_args),
            env=dict(k.env),
            cpu=k.cpu,
            memory=k.memory,
            shm_size=k.shm_size,
            health_path=k.health_path,
            **_options(k),
        )
    except ValueError as exc:
        raise EngineError(role, "launched", f"cannot be rendered: {exc}") from None


def group_workloads(
    gate_id: str, model: str, role: Role, k: KubernetesSpec, engine: EnginePlacement
) -> tuple[dict[str, EngineWorkload], EngineWorkload]:
    """Each worker group's workload on its reserved nodes (the shape's order), then the
    router's: a pod without GPUs on the first group's leader node. Every Service name is
    known first, so any argv can name any group's address."""
    assert k.groups is not None and k.router is not None  # the spec checks both
    try:
        groups: dict[str, EngineWorkload] = {}
        for gp in engine.groups:
            g = k.groups[gp.role]
            groups[gp.role] = EngineWorkload(
                gate_id=gate_id,
                role=role,
                group=gp.role,
                image=k.image,
                model=model,
                nodes=gp.nodes,
                gpus_per_node=gp.gpus_per_node,
                clique=clique_of(gp.domain),
                command=tuple(k.command if g.command is None else g.command),
                args=tuple(k.args if g.args is None else g.args),
                worker_command=_argv(g.worker_command or k.worker_command),
                worker_args=_argv(g.worker_args or k.worker_args),
                env={**k.env, **g.env},
                cpu=k.cpu,
                memory=k.memory,
                shm_size=k.shm_size,
                health_path=k.health_path,
                **_options(k),
            )
        refs = k8s_groups.group_refs(groups)
        for name, w in list(groups.items()):
            own = {"role": name, "group_gpus": w.placeholders()["gpus"]}
            groups[name] = replace(w, extra_placeholders={**refs, **own})
        r = k.router
        first = next(iter(groups.values()))
        router = EngineWorkload(
            gate_id=gate_id,
            role=role,
            group=ROUTER,
            image=r.image or k.image,
            model=model,
            nodes=first.nodes[:1],
            gpus_per_node=0,
            command=tuple(r.command),
            args=tuple(r.args),
            env=dict(r.env),
            shm_size=None,
            health_path=r.health_path,
            extra_placeholders={**refs, "role": ROUTER, "group_gpus": ""},
            **{**_options(k), "port": r.port},
        )
    except ValueError as exc:
        raise EngineError(role, "launched", f"cannot be rendered: {exc}") from None
    return groups, router


def kubernetes_engine(
    ctx: RunContext,
    role: Role,
    es: EngineSpec,
    placement: Placement,
    others: Sequence[Engine],
) -> k8s.KubernetesEngine | k8s_groups.GroupedKubernetesEngine:
    """One cluster per gate (the spec checks it): the first engine connects, the second
    shares its client, and its Lease when they share a namespace. The engine class is read
    from its module at each call, so a test can stand a reachable one in for it."""
    k = es.kubernetes
    assert k is not None
    pods = [
        e
        for e in others
        if isinstance(e, k8s.KubernetesEngine | k8s_groups.GroupedKubernetesEngine)
    ]
    if pods:
        api_client = pods[0].api_client
    else:
        api_client, _ = connect(kubeconfig=k.kubeconfig, context=k.context, in_cluster=k.in_cluster)
    lease = next((e.lease for e in pods if e.workload.namespace == k.namespace), None)
    lease = lease or GateLease(api_client, namespace=k.namespace, gate_id=ctx.gate_id)
    if k.groups is not None:
        engine = placement.for_role(role)
        groups, router = group_workloads(ctx.gate_id, ctx.spec.model, role, k, engine)
        return k8s_groups.GroupedKubernetesEngine(
            groups=groups,
            router=router,
            phases=ctx.phase_log(role),
            api_client=api_client,
            lease=lease,
            readiness_timeout_s=es.readiness_timeout_s,
            reserved_gpus={g.role: g.gpus[0] for g in engine.groups},
        )
    return k8s.KubernetesEngine(
        workload(ctx, role, k, placement),
        ctx.phase_log(role),
        api_client,
        lease=lease,
        readiness_timeout_s=es.readiness_timeout_s,
    )
