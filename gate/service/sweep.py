"""Cluster housekeeping after a lost worker: the Kubernetes objects of its gate.

A worker killed mid-gate cannot tear down the pods it created. They are owned by the gate's
Lease, which the dead worker no longer renews; once it has expired, `reap_expired_leases`
deletes it and the garbage collector takes the pods, Services and LeaderWorkerSets with it.
Gates that reserve in the same namespace do that first anyway; this sweep makes it happen
without waiting for one: the reapers run it for the clusters and namespaces of recently lost
gates until their Leases are gone.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gate.core.errors import GateError
from gate.reservations.kubernetes import connect, reap_namespaces
from gate.service import service
from gate.spec import parse_spec

log = logging.getLogger("gate.runs")

# Lease duration + grace after the last renewal, with room: an hour covers every gate.
WINDOW_S = 3600.0

Access = tuple[str | None, str | None, bool]  # kubeconfig, context, in_cluster


def targets(specs: Iterable[dict[str, Any]]) -> dict[Access, set[str]]:
    """Cluster access -> namespaces, for the kubernetes engines of these stored specs."""
    out: dict[Access, set[str]] = defaultdict(set)
    for raw in specs:
        try:
            spec = parse_spec(raw, source="stored gate")
        except GateError:
            continue
        for role in ("reference", "candidate"):
            k = getattr(spec, role).kubernetes
            if k is not None:
                out[(k.kubeconfig, k.context, k.in_cluster)].add(k.namespace)
    return dict(out)


def sweep_lost_gates(factory: sessionmaker[Session], within_s: float = WINDOW_S) -> list[str]:
    """Delete the expired gate Leases in the namespaces of gates lost in the last
    `within_s` seconds; returns `namespace/name` of those deleted. Failures are logged."""
    found = targets(service.lost_gate_specs(factory, within_s))
    if not found:
        return []
    reaped: list[str] = []
    for (kubeconfig, context, in_cluster), namespaces in found.items():
        try:
            api_client, cluster = connect(
                kubeconfig=kubeconfig, context=context, in_cluster=in_cluster
            )
        except GateError as exc:
            log.warning("cannot reach a lost gate's cluster: %s", exc.message)
            continue
        with api_client:
            done = reap_namespaces(api_client, namespaces)
        for name in done:
            log.warning("%s: deleted the expired Lease of a lost gate (%s)", cluster, name)
        reaped += done
    return reaped
