"""The pure allocator: where do the gate's engines fit, how many gates fit, or exactly why not.

No I/O: it takes the inventory, the shape and the GPUs already held by other reservations, and
answers three questions from ../shared/reference/gpu-shapes.md and the seed document:

- capacity: how many eligible, connected gate shapes the fleet can provide now, per domain and
  in total (Kueue's counting, with distinct nodes per multi-node engine);
- placement: a best fit for both engines (the tightest domain that fits, so the largest shapes
  stay available), never double-booking a GPU;
- blocked: when nothing fits, a primary code from the first stage that eliminates everything
  (region -> provider -> policy -> sku -> gpu_memory -> health -> free_capacity -> topology ->
  transition_headroom -> lease_conflict), how many nodes each stage eliminated, whether waiting
  can help, and the fit of every domain.

Vocabulary. An engine is `nodes_per_engine` distinct nodes with `gpus_per_node` GPUs each, all
inside one domain of `engine_level` (host, clique, subblock, block, cluster, region, any). The
gate's engines must all sit inside one domain of `together` (default: the engine level, so both
engines share one NVLink/host domain); `together: any` only asks for the same SKU class.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gate.reservations.inventory import Node, normalise_sku

GpuKey = tuple[str, int]  # (node name, GPU index)
ROLES = ("reference", "candidate")
Level = Literal["host", "clique", "subblock", "block", "cluster", "region", "any"]
LEVELS: tuple[Level, ...] = ("host", "clique", "subblock", "block", "cluster", "region", "any")
STAGES = (
    "region",
    "provider",
    "policy",
    "sku",
    "gpu_memory",
    "health",
    "free_capacity",
    "topology",
    "transition_headroom",
    "lease_conflict",
)
# Waiting cannot change what a node is (region, provider, pool, SKU, memory); it can bring a node
# back to health, free GPUs, or end other reservations.
RETRYABLE = {
    "region": False,
    "provider": False,
    "policy": False,
    "sku": False,
    "gpu_memory": False,
    "health": True,
    "free_capacity": True,
    "topology": True,  # refined below: False when the shape cannot fit even an empty fleet
    "transition_headroom": True,
    "lease_conflict": True,
}


@dataclass(frozen=True, slots=True)
class ShapeRequest:
    sku: str | None = None
    min_gpu_memory_gib: float | None = None
    gpus_per_engine: int = 1
    nodes_per_engine: int = 1
    engine_level: Level = "host"
    together: Level | None = None  # None: the engine level
    regions: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    headroom_gpus: int = 0  # GPUs that must stay free in the gate's domain after placing it
    roles: tuple[str, ...] = ROLES  # the engines that need GPUs (attached ones do not)

    def __post_init__(self) -> None:
        if self.gpus_per_engine < 1 or self.nodes_per_engine < 1:
            raise ValueError("gpus_per_engine and nodes_per_engine must be at least 1")
        if self.gpus_per_engine % self.nodes_per_engine:
            raise ValueError("gpus_per_engine must be a multiple of nodes_per_engine")
        if LEVELS.index(self.pair_level) < LEVELS.index(self.engine_level):
            raise ValueError("together must be a level at or above engine_level")

    @property
    def gpus_per_node(self) -> int:
        return self.gpus_per_engine // self.nodes_per_engine

    @property
    def pair_level(self) -> Level:
        return self.together or self.engine_level

    @property
    def gpus_per_gate(self) -> int:
        return self.gpus_per_engine * len(self.roles)


@dataclass(frozen=True, slots=True)
class EnginePlacement:
    role: str
    nodes: tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPU indices) per worker
    sku: str
    domain: str

    @property
    def node(self) -> str:
        """The leader's node (the only one for single-node engines)."""
        return self.nodes[0][0]

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.nodes[0][1]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)


@dataclass(frozen=True, slots=True)
class Placement:
    engines: tuple[EnginePlacement, ...]
    domain: str

    def for_role(self, role: str) -> EnginePlacement:
        for e in self.engines:
            if e.role == role:
                return e
        raise KeyError(role)

    def gpu_keys(self) -> list[tuple[str, GpuKey]]:
        return [(e.role, (n, g)) for e in self.engines for n, gpus in e.nodes for g in gpus]


@dataclass(frozen=True, slots=True)
class DomainFit:
    domain: str
    nodes: int
    free_gpus: int
    engines: int  # disjoint engines that fit now
    gates: int  # gate shapes that fit now (all engines, headroom respected)


@dataclass(frozen=True, slots=True)
class Capacity:
    gates: int
    engines: int
    free_gpus: int
    eligible_nodes: int
    level: Level
    per_domain: tuple[DomainFit, ...]


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why nothing fits: the first stage that left nothing, and what each stage removed."""

    code: str
    message: str
    eliminated: dict[str, int] = field(default_factory=dict)
    retryable: bool = False
    per_domain: tuple[DomainFit, ...] = ()


# -- domains -----------------------------------------------------------------------------------


def domain_of(node: Node, level: Level) -> str:
    """The node's domain at `level`. An unlabelled level makes the node a domain of its own
    (except `clique`, where an unlabelled node's NVLink domain is the host itself): never assume
    a connection the labels do not state."""
    if level == "host":
        return node.name
    if level == "cluster":
        return f"{node.region}/{node.cluster}"
    if level == "region":
        return node.region
    if level == "any":
        return "*"
    label = node.topology.get(level)
    if label:
        return f"{node.cluster}/{level}={label}"
    return node.name


def _engine_capacity(slots: Sequence[int], n: int) -> int:
    """Most disjoint engines of `n` distinct nodes, node i offering slots[i] workers:
    the largest k with sum(min(s, k)) >= k * n (each node serves an engine at most once)."""
    if n == 1:
        return sum(slots)
    total = sum(slots)
    lo, hi = 0, total // n
    while lo < hi:
        k = (lo + hi + 1) // 2
        if sum(min(s, k) for s in slots) >= k * n:
            lo = k
        else:
            hi = k - 1
    return lo


@dataclass
class _View:
    """Eligible nodes grouped pair-domain -> engine-domain -> nodes, with free GPU indices."""

    shape: ShapeRequest
    free: dict[str, list[int]]
    groups: dict[str, dict[str, list[Node]]]

    def slots(self, node: Node) -> int:
        return len(self.free[node.name]) // self.shape.gpus_per_node

    def engine_caps(self, pair: str) -> dict[str, int]:
        n = self.shape.nodes_per_engine
        return {
            dom: _engine_capacity([self.slots(x) for x in nodes], n)
            for dom, nodes in self.groups[pair].items()
        }

    def fit(self, pair: str, headroom: bool = True) -> DomainFit:
        nodes = [x for group in self.groups[pair].values() for x in group]
        free = sum(len(self.free[x.name]) for x in nodes)
        engines = sum(self.engine_caps(pair).values())
        gates = engines // len(self.shape.roles)
        if headroom and self.shape.headroom_gpus:
            gates = min(gates, max(0, free - self.shape.headroom_gpus) // self.shape.gpus_per_gate)
        return DomainFit(pair, len(nodes), free, engines, gates)


def _view(nodes: Sequence[Node], shape: ShapeRequest, held: set[GpuKey], *, base: bool) -> _View:
    """`base` ignores GPUs held by other workloads (allocated) and reservations: the empty fleet."""
    free: dict[str, list[int]] = {}
    groups: dict[str, dict[str, list[Node]]] = defaultdict(lambda: defaultdict(list))
    for x in nodes:
        usable = x.gpus if base else x.gpus - x.allocated_gpus
        free[x.name] = [g for g in range(usable) if (x.name, g) not in held]
        groups[domain_of(x, shape.pair_level)][domain_of(x, shape.engine_level)].append(x)
    return _View(shape, free, groups)


def _eligible(
    nodes: Sequence[Node], shape: ShapeRequest
) -> tuple[list[Node], dict[str, int], str | None]:
    """Apply the eligibility stages in order; return the survivors, the count each stage
    removed, and the first stage that removed everything (or None)."""
    want_sku = normalise_sku(shape.sku) if shape.sku else None
    tests: tuple[tuple[str, Callable[[Node], bool]], ...] = (
        ("region", lambda x: not shape.regions or x.region in shape.regions),
        ("provider", lambda x: not shape.providers or x.provider in shape.providers),
        ("policy", lambda x: not shape.pools or x.pool in shape.pools),
        ("sku", lambda x: want_sku is None or x.normalised_sku == want_sku),
        (
            "gpu_memory",
            lambda x: (
                shape.min_gpu_memory_gib is None or x.gpu_memory_gib >= shape.min_gpu_memory_gib
            ),
        ),
        ("health", lambda x: x.healthy and not x.cordoned and not x.taints),
    )
    eliminated: dict[str, int] = {}
    remaining = list(nodes)
    for stage, keep in tests:
        survivors = [x for x in remaining if keep(x)]
        eliminated[stage] = len(remaining) - len(survivors)
        remaining = survivors
        if not remaining:
            return [], eliminated, stage
    return remaining, eliminated, None


def _stage_message(stage: str, shape: ShapeRequest) -> str:
    return {
        "region": f"no node in regions {list(shape.regions)}",
        "provider": f"no eligible node from providers {list(shape.providers)}",
        "policy": f"no eligible node in pools {list(shape.pools)}",
        "sku": f"no eligible node has GPU SKU {normalise_sku(shape.sku or '')}",
        "gpu_memory": f"no eligible node has >= {shape.min_gpu_memory_gib:g} GiB per GPU"
        if shape.min_gpu_memory_gib is not None
        else "",
        "health": "every eligible node is unhealthy, cordoned or tainted",
    }[stage]


# -- the three questions -------------------------------------------------------------------------


def capacity(nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey] = ()) -> Capacity:
    """How many gate shapes fit now, per domain of the `together` level and in total."""
    eligible, _, _ = _eligible(nodes, shape)
    view = _view(eligible, shape, set(held), base=False)
    fits = tuple(sorted((view.fit(p) for p in view.groups), key=lambda f: (-f.gates, f.domain)))
    return Capacity(
        gates=sum(f.gates for f in fits),
        engines=sum(f.engines for f in fits),
        free_gpus=sum(f.free_gpus for f in fits),
        eligible_nodes=len(eligible),
        level=shape.pair_level,
        per_domain=fits,
    )


def allocate(
    nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey] = ()
) -> Placement | Blocked:
    held_set = set(held)
    eligible, eliminated, stage = _eligible(nodes, shape)
    if stage is not None:
        return Blocked(stage, _stage_message(stage, shape), eliminated, RETRYABLE[stage])
    view = _view(eligible, shape, held_set, base=False)
    fits = {p: view.fit(p) for p in view.groups}
    options = [f for f in fits.values() if f.gates >= 1]
    if options:
        # Best fit: the domain with the fewest gate shapes left that still fits, so the large
        # empty domains stay whole for shapes that need them.
        best = min(options, key=lambda f: (f.gates, f.engines, f.free_gpus, f.domain))
        return _place(view, best.domain)
    return _diagnose(eligible, shape, held_set, eliminated, tuple(fits.values()))


def _place(view: _View, pair: str) -> Placement:
    shape = view.shape
    gpn, n = shape.gpus_per_node, shape.nodes_per_engine
    engines: list[EnginePlacement] = []
    for role in shape.roles:
        caps = view.engine_caps(pair)
        # The engine domain with the least room that still fits one engine: tight packing.
        dom = min(
            (d for d, c in caps.items() if c >= 1),
            key=lambda d: (caps[d], sum(len(view.free[x.name]) for x in view.groups[pair][d]), d),
        )
        members = [x for x in view.groups[pair][dom] if view.slots(x) >= 1]
        if n == 1:
            # One node: the tightest that fits keeps emptier nodes whole.
            chosen = [min(members, key=lambda x: (view.slots(x), x.name))]
        else:
            # Several distinct nodes: the ones with the most slots left first, which is what
            # keeps the domain's remaining engine capacity at its maximum (exchange argument).
            chosen = sorted(members, key=lambda x: (-view.slots(x), x.name))[:n]
        workers = []
        for x in chosen:
            take, view.free[x.name] = view.free[x.name][:gpn], view.free[x.name][gpn:]
            workers.append((x.name, tuple(take)))
        engines.append(EnginePlacement(role, tuple(workers), chosen[0].normalised_sku, dom))
    return Placement(tuple(engines), pair)


def _diagnose(
    eligible: list[Node],
    shape: ShapeRequest,
    held: set[GpuKey],
    eliminated: dict[str, int],
    fits: tuple[DomainFit, ...],
) -> Blocked:
    """Nothing fits: find the first later stage that explains it, by relaxing the world one
    layer at a time (no leases, then no headroom rule, then no topology)."""
    roles, n, gpn = len(shape.roles), shape.nodes_per_engine, shape.gpus_per_node
    no_leases = _view(eligible, shape, set(), base=False)
    out = dict(eliminated)
    out["free_capacity"] = sum(1 for x in eligible if len(no_leases.free[x.name]) < gpn)
    free_total = sum(len(v) for v in no_leases.free.values())
    if free_total < shape.gpus_per_gate:
        # The GPU-count view: not enough free GPUs anywhere, whatever the topology. Waiting
        # helps only if the eligible fleet is big enough when empty.
        return Blocked(
            "free_capacity",
            f"{free_total} GPUs are free on the eligible nodes; the gate needs "
            f"{shape.gpus_per_gate} ({roles} engines x {shape.gpus_per_engine})",
            out,
            sum(x.gpus for x in eligible) >= shape.gpus_per_gate,
            fits,
        )
    no_headroom_fit = {p: no_leases.fit(p, headroom=False) for p in no_leases.groups}
    if not any(f.gates >= 1 for f in no_headroom_fit.values()):
        out["topology"] = sum(f.nodes for f in no_headroom_fit.values())
        empty = _view(eligible, shape, set(), base=True)
        possible = any(empty.fit(p, headroom=False).gates >= 1 for p in empty.groups)
        where = f"one {shape.pair_level} domain"
        if not possible:
            msg = (
                f"no {shape.pair_level} domain of this fleet can ever hold {roles} engines of "
                f"{shape.gpus_per_engine} GPUs ({n} x {gpn})"
            )
        else:
            msg = (
                f"enough free GPUs in total, but fragmented: none fits {roles} engines of "
                f"{shape.gpus_per_engine} GPUs in {where} now"
            )
        return Blocked("topology", msg, out, possible, fits)
    with_headroom = {p: no_leases.fit(p) for p in no_leases.groups}
    if not any(f.gates >= 1 for f in with_headroom.values()):
        out["transition_headroom"] = sum(
            f.nodes for p, f in with_headroom.items() if no_headroom_fit[p].gates >= 1
        )
        return Blocked(
            "transition_headroom",
            f"the shape fits only by leaving fewer than {shape.headroom_gpus} GPUs free in its "
            f"{shape.pair_level} domain",
            out,
            True,
            fits,
        )
    out["lease_conflict"] = sum(f.nodes for p, f in with_headroom.items() if f.gates >= 1)
    held_here = sum(1 for x in eligible for g in range(x.gpus) if (x.name, g) in held)
    return Blocked(
        "lease_conflict",
        f"the shape would fit, but other gate reservations hold {held_here} of the eligible GPUs",
        out,
        True,
        fits,
    )
