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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Literal, NamedTuple

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


class DomainFit(NamedTuple):
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


def _key(level: Level) -> Callable[[Node], str]:
    """`domain_of` for one level, as a cheap callable for the per-node hot loop."""
    if level == "host":
        return attrgetter("name")
    return lambda x: domain_of(x, level)


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
    """Eligible nodes grouped pair-domain -> engine-domain -> nodes, with free GPU counts.

    Only counts are needed to count shapes; the free GPU indices of a node are materialised
    when a placement takes GPUs from it, which keeps capacity() on a 10,000-node fleet fast.
    """

    shape: ShapeRequest
    free_count: dict[str, int]
    usable: dict[str, int]
    held_by_node: dict[str, set[int]]
    groups: dict[str, dict[str, list[Node]]]
    lists: dict[str, list[int]] = field(default_factory=dict)

    def slots(self, node: Node) -> int:
        return self.free_count[node.name] // self.shape.gpus_per_node

    def free_list(self, name: str) -> list[int]:
        if name not in self.lists:
            taken = self.held_by_node.get(name, set())
            self.lists[name] = [g for g in range(self.usable[name]) if g not in taken]
        return self.lists[name]

    def take(self, name: str, count: int) -> tuple[int, ...]:
        gpus = self.free_list(name)
        got, self.lists[name] = gpus[:count], gpus[count:]
        self.free_count[name] -= len(got)
        return tuple(got)

    def engine_caps(self, pair: str) -> dict[str, int]:
        n, gpn, free = self.shape.nodes_per_engine, self.shape.gpus_per_node, self.free_count
        if n == 1:
            return {
                dom: sum(free[x.name] // gpn for x in nodes)
                for dom, nodes in self.groups[pair].items()
            }
        return {
            dom: _engine_capacity([free[x.name] // gpn for x in nodes], n)
            for dom, nodes in self.groups[pair].items()
        }

    def fit(self, pair: str, headroom: bool = True) -> DomainFit:
        free = self.free_count
        domains = self.groups[pair]
        count = sum(len(nodes) for nodes in domains.values())
        free_gpus = sum(free[x.name] for nodes in domains.values() for x in nodes)
        engines = sum(self.engine_caps(pair).values())
        return self._fit(pair, count, free_gpus, engines, headroom)

    def _fit(
        self, pair: str, count: int, free_gpus: int, engines: int, headroom: bool
    ) -> DomainFit:
        gates = engines // len(self.shape.roles)
        if headroom and self.shape.headroom_gpus:
            spare = max(0, free_gpus - self.shape.headroom_gpus)
            gates = min(gates, spare // self.shape.gpus_per_gate)
        return DomainFit(pair, count, free_gpus, engines, gates)

    def fits(self, headroom: bool = True) -> dict[str, DomainFit]:
        """Every pair domain's fit in one pass (the hot loop of capacity and allocate)."""
        if self.shape.nodes_per_engine > 1:
            return {p: self.fit(p, headroom) for p in self.groups}
        gpn, free = self.shape.gpus_per_node, self.free_count
        out: dict[str, DomainFit] = {}
        for pair, domains in self.groups.items():
            count = free_gpus = engines = 0
            for nodes in domains.values():
                for x in nodes:
                    f = free[x.name]
                    free_gpus += f
                    engines += f // gpn
                count += len(nodes)
            out[pair] = self._fit(pair, count, free_gpus, engines, headroom)
        return out


def _view(nodes: Sequence[Node], shape: ShapeRequest, held: set[GpuKey], *, base: bool) -> _View:
    """`base` ignores GPUs held by other workloads (allocated) and reservations: the empty fleet."""
    held_by_node: dict[str, set[int]] = {}
    if not base:
        for name, g in held:
            held_by_node.setdefault(name, set()).add(g)
    free_count: dict[str, int] = {}
    usable_of: dict[str, int] = {}
    groups: dict[str, dict[str, list[Node]]] = {}
    pair_key, engine_key = _key(shape.pair_level), _key(shape.engine_level)
    same = shape.pair_level == shape.engine_level
    for x in nodes:
        name = x.name
        usable = x.gpus if base else x.gpus - x.allocated_gpus
        usable_of[name] = usable
        taken = held_by_node.get(name)
        free_count[name] = usable - sum(1 for g in taken if g < usable) if taken else usable
        pair = pair_key(x)
        eng = pair if same else engine_key(x)
        groups.setdefault(pair, {}).setdefault(eng, []).append(x)
    return _View(shape, free_count, usable_of, held_by_node, groups)


def _eligible(
    nodes: Sequence[Node], shape: ShapeRequest
) -> tuple[list[Node], dict[str, int], str | None]:
    """Apply the eligibility stages in order (one pass); return the survivors, the count each
    stage removed, and the first stage that removed everything (or None)."""
    want_sku = normalise_sku(shape.sku) if shape.sku else None
    regions, providers, pools = set(shape.regions), set(shape.providers), set(shape.pools)
    min_mem = shape.min_gpu_memory_gib
    names = STAGES[:6]
    removed = [0] * len(names)
    survivors: list[Node] = []
    for x in nodes:
        if regions and x.region not in regions:
            removed[0] += 1
        elif providers and x.provider not in providers:
            removed[1] += 1
        elif pools and x.pool not in pools:
            removed[2] += 1
        elif want_sku is not None and normalise_sku(x.sku) != want_sku:
            removed[3] += 1
        elif min_mem is not None and x.gpu_memory_gib < min_mem:
            removed[4] += 1
        elif not x.healthy or x.cordoned or x.taints:
            removed[5] += 1
        else:
            survivors.append(x)
    eliminated = dict(zip(names, removed, strict=True))
    if survivors:
        return survivors, eliminated, None
    # The first stage that left nothing: the last one that removed any node.
    last = max((i for i, r in enumerate(removed) if r), default=0)
    for later in names[last + 1 :]:
        eliminated.pop(later, None)
    return [], eliminated, names[last]


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


def _held_by_node(held: Iterable[GpuKey]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for name, g in held:
        out.setdefault(name, set()).add(g)
    return out


def _host_fits(
    eligible: Sequence[Node], shape: ShapeRequest, held: dict[str, set[int]]
) -> dict[str, DomainFit]:
    """The common gate shape (single-node engines sharing one host) needs no grouping: each
    host is its own domain, so its fit is a few integer operations."""
    gpn, roles, room = shape.gpus_per_node, len(shape.roles), shape.headroom_gpus
    per_gate = shape.gpus_per_gate
    out: dict[str, DomainFit] = {}
    for x in eligible:
        usable = x.gpus - x.allocated_gpus
        taken = held.get(x.name)
        free = usable - sum(1 for g in taken if g < usable) if taken else usable
        engines = free // gpn
        gates = engines // roles
        if room:
            gates = min(gates, max(0, free - room) // per_gate)
        out[x.name] = DomainFit(x.name, 1, free, engines, gates)
    return out


def _fast_path(shape: ShapeRequest) -> bool:
    return shape.pair_level == "host" and shape.nodes_per_engine == 1


def capacity(nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey] = ()) -> Capacity:
    """How many gate shapes fit now, per domain of the `together` level and in total."""
    eligible, _, _ = _eligible(nodes, shape)
    if _fast_path(shape):
        found = _host_fits(eligible, shape, _held_by_node(held))
    else:
        found = _view(eligible, shape, set(held), base=False).fits()
    # Most gates first, then by domain name (a stable sort over the name-sorted list).
    fits = tuple(sorted(sorted(found.values()), key=itemgetter(4), reverse=True))
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
    if _fast_path(shape):
        fits = _host_fits(eligible, shape, _held_by_node(held_set))
    else:
        view = _view(eligible, shape, held_set, base=False)
        fits = view.fits()
    options = [f for f in fits.values() if f.gates >= 1]
    if options:
        # Best fit: the domain with the fewest gate shapes left that still fits, so the large
        # empty domains stay whole for shapes that need them.
        best = min(options, key=lambda f: (f.gates, f.engines, f.free_gpus, f.domain))
        if _fast_path(shape):
            # Only the chosen host needs the full view to pick GPU indices.
            view = _view(
                [x for x in eligible if x.name == best.domain], shape, held_set, base=False
            )
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
            key=lambda d: (caps[d], sum(view.free_count[x.name] for x in view.groups[pair][d]), d),
        )
        members = [x for x in view.groups[pair][dom] if view.slots(x) >= 1]
        if n == 1:
            # One node: the tightest that fits keeps emptier nodes whole.
            chosen = [min(members, key=lambda x: (view.slots(x), x.name))]
        else:
            # Several distinct nodes: the ones with the most slots left first, which is what
            # keeps the domain's remaining engine capacity at its maximum (exchange argument).
            chosen = sorted(members, key=lambda x: (-view.slots(x), x.name))[:n]
        workers = [(x.name, view.take(x.name, gpn)) for x in chosen]
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
    out["free_capacity"] = sum(1 for x in eligible if no_leases.free_count[x.name] < gpn)
    free_total = sum(no_leases.free_count.values())
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
    no_headroom_fit = no_leases.fits(headroom=False)
    if not any(f.gates >= 1 for f in no_headroom_fit.values()):
        out["topology"] = sum(f.nodes for f in no_headroom_fit.values())
        empty = _view(eligible, shape, set(), base=True)
        possible = any(f.gates >= 1 for f in empty.fits(headroom=False).values())
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
    with_headroom = no_leases.fits()
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
