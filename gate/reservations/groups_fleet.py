"""The inventory as a multi-group shape reads it: the scan, the fleet and its counts.

`scan` reads the inventory once per shape (eligibility, each group's SKU and memory, a domain key
per node and level in play: the costly part); `fleet` lays the free counts of one moment over a
scan, and `project` reads a smaller shape's scan from a larger one (the blocked answer relaxes
the shape group by group without scanning again). The counts here (each group alone, the upper
bound on the gates a `together` domain holds) are what `groups_search.py` orders and prunes by.
The design is in `groups.py`. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING

from gate.reservations.inventory import Node, normalise_sku
from gate.reservations.shapes import (
    LEVELS,
    STAGES,
    DomainFit,
    GpuKey,
    GroupRequest,
    Level,
    ShapeRequest,
    domain_key,
    domain_of,
    held_by_node,
)

if TYPE_CHECKING:  # the fleet keeps the search's plan and host classes between searches
    from gate.reservations.groups_search import HostClasses, Plan


def engine_capacity(slots: Sequence[int], n: int) -> int:
    """Most disjoint instances of `n` distinct nodes, node i offering slots[i] workers:
    the largest k with sum(min(s, k)) >= k * n (each node serves an instance at most once)."""
    total = sum(slots)
    if n == 1:
        return total
    if max(slots, default=0) <= 1:  # no node offers two workers (the usual large group)
        return total // n
    lo, hi = 0, total // n
    while lo < hi:
        k = (lo + hi + 1) // 2
        if sum([s if s < k else k for s in slots]) >= k * n:
            lo = k
        else:
            hi = k - 1
    return lo


Domains = dict[tuple[str, ...], list[int]]  # a domain's key -> its candidate nodes
Layout = tuple[int, tuple[int, ...], tuple[int, ...]]  # group, fixed and domain levels
# A candidate domain's tightness (instances of the group that fit, free GPUs, first node) and
# its nodes with room for one worker.
Ranked = tuple[tuple[int, int, int], list[int]]


@dataclass
class Fleet:
    """The eligible nodes of a multi-group shape, indexed by integers in inventory order: free
    counts (mutable), the domain key of each node at every level in play, which groups each
    node may serve, and the `together` domains. GPU indices are drawn only for a grant."""

    shape: ShapeRequest
    groups: tuple[GroupRequest, ...]
    nodes: list[Node]
    free: list[int]
    usable: list[int]  # what no gate holds: allocated GPUs out (all GPUs for the empty fleet)
    mask: list[int]
    keys: list[tuple[str, ...]]  # per node: its domain at each of `levels`
    levels: tuple[Level, ...]
    sig_levels: tuple[int, ...]
    pairs: dict[str, list[int]]
    held: dict[str, set[int]]
    eliminated: dict[str, int]
    scan: Scan
    base: bool
    sigs: list[int] = field(default_factory=list)  # filled on demand, -1 until then
    sig_ids: dict[tuple[object, ...], int] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # group indices, placement order
    plan: Plan | None = None
    stats: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    # (together domain, step layout) -> fixed rules' values -> domain key -> nodes
    buckets: dict[tuple[str, Layout], dict[tuple[str, ...], Domains]] = field(default_factory=dict)
    # (together domain, group, level) -> domain at that level -> the group's nodes with room
    by_rule: dict[tuple[str, int, int], dict[str, list[int]]] = field(default_factory=dict)
    # Every node whose free count the search changed, in order: a step's ranked domains are
    # brought up to date from it (only the domains of nodes changed since are ranked again).
    changed: list[int] = field(default_factory=list)
    ranked: dict[tuple[object, ...], tuple[int, dict[tuple[str, ...], Ranked]]] = field(
        default_factory=dict
    )
    hosts: dict[tuple[object, ...], tuple[int, HostClasses]] = field(default_factory=dict)

    def lvl(self, level: Level) -> int:
        return self.levels.index(level)

    def key(self, i: int, level: Level) -> str:
        """Node i's domain at `level` (host keys are kept only where a rule needs them)."""
        if level == "host" and "host" not in self.levels:
            return self.nodes[i].name
        return self.keys[i][self.lvl(level)]

    def sig(self, i: int) -> int:
        """Which nodes node i is interchangeable with, given equal free GPUs: the same domains
        at every level in play (hosts told apart only where a rule asks for one host) and the
        same eligibility."""
        s = self.sigs[i]
        if s < 0:
            k = self.keys[i]
            key = (*(k[j] for j in self.sig_levels), self.mask[i])
            s = self.sigs[i] = self.sig_ids.setdefault(key, len(self.sig_ids))
        return s


def _key_fn(level: Level) -> Callable[[Node], str]:
    """`domain_of` at one level, unrolled for the per-node loop of build()."""
    if level in ("host", "cluster", "region", "any"):
        return domain_key(level)

    def labelled(x: Node) -> str:
        label = x.topology.get(level)
        return f"{x.cluster}/{level}={label}" if label else x.name

    return labelled


@dataclass(frozen=True)
class Scan:
    """What one shape reads from the inventory whatever the gates hold (the costly part of a
    fleet: a domain key per node and level): the eligible nodes in inventory order, which
    groups each may serve, their GPUs (all of them, and those no other workload uses), their
    domain keys and the `together` domains. Shared, read-only, by every fleet built from it."""

    shape: ShapeRequest
    nodes: list[Node]
    names: list[str]
    gpus: list[int]
    unallocated: list[int]
    masks: list[int]
    keys: list[tuple[str, ...]]
    levels: tuple[Level, ...]
    pairs: dict[str, list[int]]
    eliminated: dict[str, int]
    # Each group's rarity on all GPUs (base) or on those no other workload uses: the same
    # for every fleet of this scan, whatever gates hold (see order_groups).
    rarity: dict[bool, list[tuple[int, int]]] = field(default_factory=dict)


def _levels(shape: ShapeRequest) -> tuple[Level, ...]:
    """The levels a shape's search tells apart. Host keys tell nodes apart only where a rule
    asks for one host (a connect rule or `together` at host); elsewhere a host-level group's
    domain is just its node."""
    groups, pair = shape.group_list, shape.pair_level
    host_matters = "host" in {c.level for c in shape.connect} or pair == "host"
    in_play = {pair, *(g.level for g in groups), *(c.level for c in shape.connect)}
    return tuple(lv for lv in LEVELS if lv in in_play and (lv != "host" or host_matters))


def scan(nodes: Sequence[Node], shape: ShapeRequest) -> Scan:
    """One pass: the shared eligibility stages, each group's SKU and memory, domain keys
    (nodes keep the inventory's order, which breaks every tie)."""
    groups = shape.group_list
    want = [(normalise_sku(g.sku) if g.sku else None, g.min_gpu_memory_gib) for g in groups]
    everyone = (1 << len(groups)) - 1
    same = all(w == want[0] for w in want)  # one SKU and memory rule for every group
    want_sku, want_mem = want[0]
    regions, providers, pools = set(shape.regions), set(shape.providers), set(shape.pools)
    removed = dict.fromkeys(STAGES[:6], 0)
    levels = _levels(shape)
    fns = [_key_fn(lv) for lv in levels]
    pi = levels.index(shape.pair_level)
    one_level = len(fns) == 1
    out_nodes: list[Node] = []
    masks: list[int] = []
    keys: list[tuple[str, ...]] = []
    pairs: dict[str, list[int]] = {}
    for x in nodes:
        if regions and x.region not in regions:
            removed["region"] += 1
            continue
        if providers and x.provider not in providers:
            removed["provider"] += 1
            continue
        if pools and x.pool not in pools:
            removed["policy"] += 1
            continue
        if same:
            # One rule for every group (the usual case): one check.
            if want_sku is not None and normalise_sku(x.sku) != want_sku:
                removed["sku"] += 1
                continue
            if want_mem is not None and x.gpu_memory_gib < want_mem:
                removed["gpu_memory"] += 1
                continue
            mask = everyone
        else:
            nsku, mask, sku_ok = normalise_sku(x.sku), 0, False
            for j, (sku, mem) in enumerate(want):
                if sku is not None and nsku != sku:
                    continue
                sku_ok = True
                if mem is None or x.gpu_memory_gib >= mem:
                    mask |= 1 << j
            if not mask:
                removed["gpu_memory" if sku_ok else "sku"] += 1
                continue
        if not x.healthy or x.cordoned or x.taints:
            removed["health"] += 1
            continue
        k = (fns[0](x),) if one_level else tuple([fn(x) for fn in fns])
        pairs.setdefault(k[pi], []).append(len(out_nodes))
        out_nodes.append(x)
        masks.append(mask)
        keys.append(k)
    return Scan(
        shape,
        out_nodes,
        [x.name for x in out_nodes],
        [x.gpus for x in out_nodes],
        [x.gpus - x.allocated_gpus for x in out_nodes],
        masks,
        keys,
        levels,
        pairs,
        removed,
    )


def project(s: Scan, sub: ShapeRequest) -> Scan:
    """The scan of a shape with some of `s.shape`'s groups and rules (same `together`), read
    from `s` instead of the inventory: the same nodes, masks and keys a fresh scan gives.
    Only `eliminated` stays the full shape's (what the groups left out would not have)."""
    levels = _levels(sub)
    at = [s.levels.index(lv) for lv in levels]
    pi = levels.index(sub.pair_level)
    roles = [g.role for g in s.shape.group_list]
    bits = [(1 << roles.index(g.role), 1 << j) for j, g in enumerate(sub.group_list)]
    remap = {m: sum(new for old, new in bits if m & old) for m in set(s.masks)}
    if all(remap.values()):  # every node stays: only the masks, and maybe the keys, change
        if at == list(range(len(s.levels))):
            same_keys, same_pairs = s.keys, s.pairs
        else:
            same_keys, same_pairs = [tuple([k[j] for j in at]) for k in s.keys], {}
            for i, k in enumerate(same_keys):
                same_pairs.setdefault(k[pi], []).append(i)
        return Scan(
            sub,
            s.nodes,
            s.names,
            s.gpus,
            s.unallocated,
            [remap[m] for m in s.masks],
            same_keys,
            levels,
            same_pairs,
            dict(s.eliminated),
        )
    nodes: list[Node] = []
    masks: list[int] = []
    keys: list[tuple[str, ...]] = []
    pairs: dict[str, list[int]] = {}
    kept: list[int] = []
    for i, m in enumerate(s.masks):
        mask = remap[m]
        if not mask:
            continue
        k = tuple([s.keys[i][j] for j in at])
        pairs.setdefault(k[pi], []).append(len(nodes))
        nodes.append(s.nodes[i])
        masks.append(mask)
        keys.append(k)
        kept.append(i)
    return Scan(
        sub,
        nodes,
        [s.names[i] for i in kept],
        [s.gpus[i] for i in kept],
        [s.unallocated[i] for i in kept],
        masks,
        keys,
        levels,
        pairs,
        dict(s.eliminated),
    )


def fleet(s: Scan, held: Iterable[GpuKey], base: bool) -> Fleet:
    """The scan's nodes with their free counts: `base` is the empty fleet (nothing allocated,
    nothing held); otherwise what other workloads and these held GPUs leave."""
    usable_of = s.gpus if base else s.unallocated
    held_map = {} if base else held_by_node(held)
    free = list(usable_of)
    if held_map:
        for i, name in enumerate(s.names):
            taken = held_map.get(name)
            if taken:
                usable = usable_of[i]
                free[i] = usable - (
                    len(taken) if max(taken) < usable else len([g for g in taken if g < usable])
                )
    return Fleet(
        s.shape,
        s.shape.group_list,
        s.nodes,
        free,
        list(usable_of),
        s.masks,
        s.keys,
        s.levels,
        tuple(range(len(s.levels))),
        s.pairs,
        held_map,
        s.eliminated,
        scan=s,
        base=base,
        sigs=[-1] * len(s.nodes),
    )


def build(nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey], base: bool) -> Fleet:
    """`scan`, then `fleet`: the nodes of a shape with their free counts."""
    return fleet(scan(nodes, shape), held, base)


# -- counting ------------------------------------------------------------------------------------


def instances(
    f: Fleet, members: Sequence[int], g: int, free: Sequence[int] | None = None
) -> tuple[int, int]:
    """Group g alone among `members` (with these free counts, default the fleet's): (domains
    of its level holding one instance, instances)."""
    grp = f.groups[g]
    gpn, n, bit = grp.gpus_per_node, grp.nodes, 1 << g
    free = f.free if free is None else free
    mask = f.mask
    if grp.level == "host":
        slots = [s for i in members if mask[i] & bit and (s := free[i] // gpn)]
        return len(slots), sum(slots)
    if grp.level == f.shape.pair_level:  # the whole `together` domain is one of its domains
        slots = [s for i in members if mask[i] & bit and (s := free[i] // gpn)]
        c = engine_capacity(slots, n) if len(slots) >= n else 0
        return (1 if c else 0), c
    li = f.lvl(grp.level)
    by: dict[str, list[int]] = {}
    keys = f.keys
    for i in members:
        if mask[i] & bit:
            s = free[i] // gpn
            if s:
                by.setdefault(keys[i][li], []).append(s)
    doms = inst = 0
    for slots in by.values():
        if len(slots) >= n:
            c = engine_capacity(slots, n)
            if c:
                doms += 1
                inst += c
    return doms, inst


def group_stats(f: Fleet, p: str) -> tuple[list[int], list[int]]:
    """Each group alone in `together` domain p: (domains of its level holding one, instances).
    Read when p is first bounded, before any search in p moves its free counts."""
    got = f.stats.get(p)
    if got is None:
        members = f.pairs[p]
        counts = [instances(f, members, g) for g in range(len(f.groups))]
        got = f.stats[p] = ([d for d, _ in counts], [c for _, c in counts])
    return got


def bound(f: Fleet, p: str, headroom: bool) -> int:
    """An upper bound on the gates domain p holds now (0 skips its search)."""
    shape, members, free = f.shape, f.pairs[p], f.free
    roles, per_gate = len(shape.roles), shape.gpus_per_gate
    total = sum(free[i] for i in members)
    ub = total // per_gate
    if headroom and shape.headroom_gpus:
        ub = min(ub, max(0, total - shape.headroom_gpus) // per_gate)
    ub = min([ub, *(c // roles for c in group_stats(f, p)[1])])
    if ub == 0:
        return 0
    # Workers that need at least t GPUs of one node each, against what the nodes can give.
    for t in sorted({g.gpus_per_node for g in f.groups}):
        big = [j for j, g in enumerate(f.groups) if g.gpus_per_node >= t]
        if len(big) < 2:
            continue
        bits = sum(1 << j for j in big)
        demand = roles * sum(f.groups[j].nodes for j in big)
        supply = sum(free[i] // t for i in members if f.mask[i] & bits)
        ub = min(ub, supply // demand)
        if ub == 0:
            return 0
    pair = shape.pair_level
    for rule in shape.connect:
        if rule.level == pair:
            continue
        li = f.lvl(rule.level)
        by: dict[str, list[int]] = {}
        for i in members:
            by.setdefault(f.keys[i][li], []).append(i)
        idx = [index_of(f, r) for r in rule.groups]
        # In each of the rule's domains: each group alone, and all of them on its free GPUs
        # (one engine's groups under the rule share the domain, on disjoint GPUs).
        bits = sum(1 << g for g in idx)
        need = sum(f.groups[g].gpus for g in idx)
        engines = sum(
            min(
                sum(free[i] for i in nodes if f.mask[i] & bits) // need,
                *(instances(f, nodes, g)[1] for g in idx),
            )
            for nodes in by.values()
        )
        ub = min(ub, engines // roles)
        if ub == 0:
            return 0
    return ub


def index_of(f: Fleet, role: str) -> int:
    return next(j for j, g in enumerate(f.groups) if g.role == role)


def domain_fit(f: Fleet, p: str, gates: int) -> DomainFit:
    members = f.pairs[p]
    return DomainFit(
        domain_of(f.nodes[members[0]], f.shape.pair_level),
        len(members),
        sum(f.free[i] for i in members),
        gates * len(f.shape.roles),
        gates,
    )


def sorted_fits(found: Iterable[DomainFit]) -> tuple[DomainFit, ...]:
    return tuple(sorted(sorted(found), key=itemgetter(4), reverse=True))
