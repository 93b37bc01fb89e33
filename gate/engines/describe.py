"""How an engine describes itself for the verdict document: what every kind shares (its URL,
startup phases, ready time, crash, log tail), where it ran, and what only its kind knows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from gate.engines.lifecycle import CrashInfo
from gate.reservations.allocator import EnginePlacement
from gate.verdict.document import (
    CrashDoc,
    EngineDoc,
    GroupPlacementDoc,
    KubernetesDoc,
    NodeGpus,
    PlacementDoc,
)

if TYPE_CHECKING:
    from gate.engines.launchers import Engine

LOG_TAIL_LINES = 30


def ready_s(eng: Engine) -> float | None:
    """Launch to ready for an engine the gate launched; None for attached or never-ready ones."""
    reached = eng.phases.reached
    if not eng.launched or "ready" not in reached or "launched" not in reached:
        return None
    return reached["ready"] - reached["launched"]


def placement_doc(p: EnginePlacement, *, every_node: bool) -> PlacementDoc:
    """The leader's node and GPUs; `every_node` adds each worker's node and the domain; an
    engine of several worker groups also each group's nodes and GPUs."""
    if len(p.groups) > 1:
        groups = [
            GroupPlacementDoc(
                role=g.role,
                nodes=[NodeGpus(node=n, gpus=list(gs)) for n, gs in g.workers],
                sku=g.sku,
                domain=g.domain,
            )
            for g in p.groups
        ]
        return PlacementDoc(
            node=p.node, gpus=list(p.gpus), sku=p.sku, domain=p.domain, groups=groups
        )
    if not every_node:
        return PlacementDoc(node=p.node, gpus=list(p.gpus), sku=p.sku)
    nodes = [NodeGpus(node=n, gpus=list(g)) for n, g in p.nodes]
    return PlacementDoc(node=p.node, gpus=list(p.gpus), sku=p.sku, nodes=nodes, domain=p.domain)


def crash_doc(crash: CrashInfo) -> CrashDoc:
    return CrashDoc(
        at_s=round(crash.at_s, 3),
        exit_code=crash.exit_code,
        description=crash.description,
        log_tail=list(crash.log_tail),
    )


def engine_doc(
    eng: Engine,
    kind: Literal["process", "endpoint", "kubernetes"],
    placement: PlacementDoc | None,
    crash: CrashInfo | None,
    *,
    log: str | None = None,
    kubernetes: KubernetesDoc | None = None,
) -> EngineDoc:
    ready = ready_s(eng)
    return EngineDoc(
        kind=kind,
        url=eng.base_url,
        pid=eng.pid,
        placement=placement,
        kubernetes=kubernetes,
        phases={k: round(v, 3) for k, v in eng.phases.reached.items()},
        ready_s=round(ready, 3) if ready is not None else None,
        crash=crash_doc(crash) if crash is not None else None,
        log=log,
        log_tail=eng.log_tail(LOG_TAIL_LINES),
    )


def unlaunched_doc(
    kind: Literal["process", "endpoint", "kubernetes"],
    url: str | None,
    placement: PlacementDoc | None,
) -> EngineDoc:
    """An engine the gate never built (it stopped before the launch)."""
    return EngineDoc(
        kind=kind,
        url=url,
        pid=None,
        placement=placement,
        kubernetes=None,
        phases={},
        ready_s=None,
        crash=None,
        log=None,
        log_tail=[],
    )
