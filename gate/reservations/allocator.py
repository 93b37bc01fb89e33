"""The pure allocator: where do two engines of one GPU shape fit, or exactly why not.

No I/O: it takes the inventory, the shape and the set of GPUs already held, and returns a
placement or a blocked reason with a primary code and the count eliminated at each stage, in the
layered order of ../shared/reference/gpu-shapes.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gate.reservations.inventory import Node, normalise_sku

GpuKey = tuple[str, int]  # (node name, GPU index)
ROLES = ("reference", "candidate")


@dataclass(frozen=True, slots=True)
class ShapeRequest:
    sku: str | None = None
    gpus_per_engine: int = 1
    min_gpu_memory_gib: float | None = None
    same_node: bool = True
    roles: tuple[str, ...] = ROLES  # the engines that need GPUs (attached ones do not)


@dataclass(frozen=True, slots=True)
class EnginePlacement:
    role: str
    node: str
    gpus: tuple[int, ...]
    sku: str
    topology: dict[str, str]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)


@dataclass(frozen=True, slots=True)
class Placement:
    engines: tuple[EnginePlacement, ...]

    def for_role(self, role: str) -> EnginePlacement:
        for e in self.engines:
            if e.role == role:
                return e
        raise KeyError(role)

    def gpu_keys(self) -> list[tuple[str, GpuKey]]:
        return [(e.role, (e.node, g)) for e in self.engines for g in e.gpus]


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why nothing fits: the first stage that left no node, and what each stage removed."""

    code: str
    message: str
    eliminated: dict[str, int] = field(default_factory=dict)
    retryable: bool = False
    per_node_free: dict[str, int] = field(default_factory=dict)


def allocate(
    nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey] = ()
) -> Placement | Blocked:
    held_set = set(held)
    eliminated: dict[str, int] = {}
    remaining = list(nodes)

    def stage(code: str, keep: list[Node]) -> None:
        nonlocal remaining
        eliminated[code] = len(remaining) - len(keep)
        remaining = keep

    if shape.sku:
        want = normalise_sku(shape.sku)
        stage("sku", [n for n in remaining if n.normalised_sku == want])
        if not remaining:
            return Blocked("sku", f"no node has GPU SKU {want}", eliminated)
    if shape.min_gpu_memory_gib is not None:
        lim = shape.min_gpu_memory_gib
        stage("gpu_memory", [n for n in remaining if n.gpu_memory_gib >= lim])
        if not remaining:
            return Blocked("gpu_memory", f"no eligible node has >= {lim:g} GiB per GPU", eliminated)
    stage("health", [n for n in remaining if n.healthy and not n.cordoned and not n.taints])
    if not remaining:
        return Blocked(
            "health", "every eligible node is unhealthy, cordoned or tainted", eliminated
        )
    total_need = shape.gpus_per_engine * len(shape.roles)
    stage("size", [n for n in remaining if n.gpus >= shape.gpus_per_engine])
    if not remaining:
        return Blocked(
            "topology", f"no node has {shape.gpus_per_engine} GPUs for one engine", eliminated
        )
    free = {n.name: [g for g in range(n.gpus) if (n.name, g) not in held_set] for n in remaining}
    per_node_free = {k: len(v) for k, v in free.items()}
    need_per_node = total_need if shape.same_node else shape.gpus_per_engine
    fitting = [n for n in remaining if len(free[n.name]) >= need_per_node]
    if shape.same_node:
        if not fitting:
            # Would the shape fit on an empty node? Then waiting for leases to end helps.
            could = [n for n in remaining if n.gpus >= total_need]
            if not could:
                return Blocked(
                    "topology",
                    f"no single node has {total_need} GPUs for {len(shape.roles)} engine(s)",
                    {**eliminated, "topology": len(remaining)},
                    retryable=False,
                    per_node_free=per_node_free,
                )
            return Blocked(
                "free_capacity",
                f"no node has {total_need} free GPUs now (held by other reservations)",
                {**eliminated, "free_capacity": len(remaining)},
                retryable=True,
                per_node_free=per_node_free,
            )
        # Best fit: the node with the fewest free GPUs that still fits keeps big shapes open.
        node = min(fitting, key=lambda n: (len(free[n.name]), n.name))
        gpus = free[node.name]
        g = shape.gpus_per_engine
        engines = tuple(
            EnginePlacement(
                role,
                node.name,
                tuple(gpus[i * g : (i + 1) * g]),
                node.normalised_sku,
                dict(node.topology),
            )
            for i, role in enumerate(shape.roles)
        )
        return Placement(engines)
    # Different nodes allowed: same SKU class; place each engine best-fit in turn.
    placements: list[EnginePlacement] = []
    taken: dict[str, int] = {}
    for role in shape.roles:
        options = [
            n
            for n in remaining
            if len(free[n.name]) - taken.get(n.name, 0) >= shape.gpus_per_engine
        ]
        if placements:
            options = [n for n in options if n.normalised_sku == placements[0].sku]
        if not options:
            return Blocked(
                "free_capacity",
                f"not enough free GPUs for the {role} engine",
                {**eliminated, "free_capacity": len(remaining)},
                retryable=True,
                per_node_free=per_node_free,
            )
        node = min(options, key=lambda n: (len(free[n.name]) - taken.get(n.name, 0), n.name))
        start = taken.get(node.name, 0)
        gpus = free[node.name][start : start + shape.gpus_per_engine]
        taken[node.name] = start + shape.gpus_per_engine
        placements.append(
            EnginePlacement(role, node.name, tuple(gpus), node.normalised_sku, dict(node.topology))
        )
    return Placement(tuple(placements))
