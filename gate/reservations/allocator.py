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

An engine of several worker groups (`ShapeRequest.groups`, e.g. prefill and decode) is placed
whole by `groups.py`: the most constrained group first, a bounded search over the alternatives,
every group of both engines or none. This module keeps the single-group shape, whose count is
exact, and both answer through `capacity` and `allocate` here. The types live in `shapes.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from gate.reservations.groups import allocate_groups, capacity_groups
from gate.reservations.groups_fleet import engine_capacity
from gate.reservations.inventory import Node
from gate.reservations.shapes import (
    LEVELS,
    RETRYABLE,
    ROLES,
    STAGES,
    Blocked,
    Capacity,
    ConnectRule,
    DomainFit,
    EnginePlacement,
    GpuKey,
    GroupFit,
    GroupPlacement,
    GroupRequest,
    Level,
    Placement,
    ShapeRequest,
    domain_key,
    domain_of,
    eligible,
    headroom_blocked,
    held_by_node,
    lease_blocked,
    stage_message,
)

__all__ = [
    "LEVELS",
    "RETRYABLE",
    "ROLES",
    "STAGES",
    "Blocked",
    "Capacity",
    "ConnectRule",
    "DomainFit",
    "EnginePlacement",
    "GpuKey",
    "GroupFit",
    "GroupPlacement",
    "GroupRequest",
    "Level",
    "Placement",
    "ShapeRequest",
    "allocate",
    "capacity",
    "domain_of",
]


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
            dom: engine_capacity([free[x.name] // gpn for x in nodes], n)
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
    pair_key, engine_key = domain_key(shape.pair_level), domain_key(shape.engine_level)
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
    return eligible(nodes, shape, shape.sku, shape.min_gpu_memory_gib)


def _stage_message(stage: str, shape: ShapeRequest) -> str:
    return stage_message(stage, shape, shape.sku, shape.min_gpu_memory_gib)


# -- the three questions -------------------------------------------------------------------------


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
    """How many gate shapes fit now, per domain of the `together` level and in total (whole
    gates: every group of every engine)."""
    if shape.multi_group:
        return capacity_groups(nodes, shape, held)
    if shape.groups:
        shape = shape.single()
    eligible, _, _ = _eligible(nodes, shape)
    if _fast_path(shape):
        found = _host_fits(eligible, shape, held_by_node(held))
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
    """Both engines whole (every group of each) or the layered reason why not."""
    if shape.multi_group:
        return allocate_groups(nodes, shape, held)
    group = shape.group_list[0].role
    if shape.groups:
        shape = shape.single()
    held_set = set(held)
    eligible, eliminated, stage = _eligible(nodes, shape)
    if stage is not None:
        return Blocked(stage, _stage_message(stage, shape), eliminated, RETRYABLE[stage])
    if _fast_path(shape):
        fits = _host_fits(eligible, shape, held_by_node(held_set))
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
        return _place(view, best.domain, group)
    return _diagnose(eligible, shape, held_set, eliminated, tuple(fits.values()))


def _place(view: _View, pair: str, group: str) -> Placement:
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
        workers = tuple((x.name, view.take(x.name, gpn)) for x in chosen)
        sku = chosen[0].normalised_sku
        names, gpus = tuple(n for n, _ in workers), tuple(g for _, g in workers)
        one = GroupPlacement(group, names, gpus, sku, dom)
        engines.append(EnginePlacement(role, workers, sku, dom, (one,)))
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
        return headroom_blocked(shape, out, fits)
    out["lease_conflict"] = sum(f.nodes for p, f in with_headroom.items() if f.gates >= 1)
    held_here = sum(1 for x in eligible for g in range(x.gpus) if (x.name, g) in held)
    return lease_blocked(held_here, out, fits)
