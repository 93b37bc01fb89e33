"""The reservation a gate's spec asks for: nothing when both engines are attached URLs (their
GPUs are not ours to hold), else the shape for the launched engines, from the operator's
inventory file or, for Kubernetes engines, the cluster's nodes."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gate.core.errors import GateError
from gate.core.vocabulary import ROLES
from gate.reservations.inventory import Inventory, load_inventory
from gate.reservations.service import GateReservation
from gate.runs.context import RunContext
from gate.spec import MIXED_KUBERNETES_MESSAGE


def gate_reservation(ctx: RunContext, on_wait: Callable[[str], None]) -> GateReservation | None:
    spec = ctx.spec
    roles = tuple(r for r in ROLES if spec.engine(r).engine_kind.launched)
    if not roles:
        return None
    pods = [k for r in roles if (k := spec.engine(r).kubernetes) is not None]
    if pods and len(pods) != len(roles):
        raise GateError(MIXED_KUBERNETES_MESSAGE)  # parse_spec refuses it; a guard
    inventory: Callable[[], Inventory]
    if pods:
        from gate.reservations.kubernetes import gate_inventory

        k = pods[0]
        inventory = partial(
            gate_inventory,
            kubeconfig=k.kubeconfig,
            context=k.context,
            in_cluster=k.in_cluster,
            cluster=k.cluster,
            namespaces=[p.namespace for p in pods],
            inventory_file=spec.inventory,
        )
    else:
        inventory = partial(load_inventory, spec.inventory or ctx.settings.inventory)
    return GateReservation(
        ctx.factory,
        inventory,
        spec.shape.request(roles),
        ctx.gate_id,
        ctx.settings.lease_ttl_s,
        wait_s=spec.shape.wait_s,
        on_wait=on_wait,
    )
