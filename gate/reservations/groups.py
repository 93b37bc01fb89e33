"""Whole engines of several worker groups: place every group of every engine, or none.

A disaggregated engine (prefill on one host, decode on two nodes of one NVLink clique) serves
nothing until every group of it runs, so the gate asks for whole engines: each group of both
engines gets its nodes and GPUs in one answer, or the gate gets nothing. Placing group after
group in the order the spec lists them is the trap of the seed document: a small, flexible
group placed first takes the only connected room a large, rigid group needed. So:

Order. Groups go most constrained first: fewest domains of their level that can hold one of
them (inside the gate's `together` domains), then fewest instances that fit, then most GPUs,
most nodes, the order written. Rarity is read from the inventory (the GPUs no other workload
uses, whatever gates hold), so every allocation from one inventory searches in one order.
Both engines' instances of the rarest group are placed before any instance of the next one.

Search. In each `together` domain, depth first over those instances. An instance's candidate
domains are those of its level (and of its connect rules not yet fixed by the same engine's
earlier groups; rules at or above `together` hold by themselves) that can hold it, tightest
first (fewest instances of the group fit, then fewest free GPUs); in each, its node sets: the
nodes are grouped into classes of interchangeable ones (same free GPUs, same domains at every
level in play, same eligibility) and the best-fit set comes first (the tightest node for a
one-node group, one try per class of hosts; the roomiest nodes for a multi-node group, which
keeps the most room for the other engine's copy of it), then every other way of drawing from
the classes. Two passes: first only the best-fit node set of every candidate domain (which
domain each group goes to is what a greedy order gets wrong), then every node set. When a step
fixes a connect rule's domain, each group of that engine still to place under the rule must
have room there, or the choice is left at once (a forward check: chronological backtracking
would otherwise retry every later choice under a domain that can never work). A domain is
searched only when cheap upper bounds say it may hold a gate: each group alone (Kueue's
count), each connect rule's domains (each group alone there, and all of them on its free
GPUs), free GPUs, workers of each size per node, and the headroom rule.

Bound. One search (one gate in one `together` domain) may always finish one straight descent
(one node set per instance), and on top of that does at most SEARCH_BUDGET (10,000) units of
work: one per candidate node or domain examined (forward checks included) and one per node
set tried. A search that runs
out counts the domain as not fitting, so on a large, fragmented domain a placement it did not
reach can be missed; within the budget the search is exhaustive up to interchangeable nodes
(the tests check it against brute force on small inventories). The cost of a search grows with
the candidates of its domain: a few milliseconds at most for a block or a clique, more for a
cluster-wide `together`.

Capacity. In each domain, gates are placed one after another by that same search, up to the
domain's bound: every gate counted is a placement the allocator makes, and allocating again and
again grants exactly that many. In a `together` domain of more than PRUNE_FROM nodes the
searches of one count share each step's ranked candidates (domains by tightness, classes of
hosts), updated from the nodes whose free counts changed since the last look instead of
rebuilt: a gate changes a handful of the hundreds of candidates a cluster-wide step has.

Blocked. The answer relaxes one layer at a time (no leases, no headroom, the groups one by
one in placement order, then each connect rule); every relaxed shape reads a projection of
the one scan of the inventory rather than scanning it again.

No I/O: the inventory, the shape and the GPUs others hold come in; a Placement, a Capacity or a
Blocked goes out.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter

from gate.reservations.inventory import Node, normalise_sku
from gate.reservations.shapes import (
    LEVELS,
    RETRYABLE,
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
    level_index,
    stage_message,
)

SEARCH_BUDGET = 10_000
PRUNE_FROM = 128  # nodes in a `together` domain: larger ones drop filled nodes between gates


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


def _count_vectors(sizes: Sequence[int], n: int) -> Iterator[tuple[int, ...]]:
    """Every way to draw `n` nodes from classes of these sizes, the most from the first
    classes first."""
    k = len(sizes)
    suffix = [0] * (k + 1)
    for i in range(k - 1, -1, -1):
        suffix[i] = suffix[i + 1] + sizes[i]
    counts = [0] * k

    def rec(i: int, left: int) -> Iterator[tuple[int, ...]]:
        if left == 0:
            yield tuple(counts)
            return
        if i == k or suffix[i] < left:
            return
        for c in range(min(sizes[i], left), -1, -1):
            if suffix[i + 1] < left - c:
                break
            counts[i] = c
            yield from rec(i + 1, left - c)
        counts[i] = 0

    yield from rec(0, n)


class _OutOfBudget(Exception):
    pass


@dataclass
class _Classes:
    """A host-level step's candidate nodes in their order, by class of interchangeable ones
    (free GPUs, signature); each class is tried once, through its first member."""

    nodes: list[int]
    order: dict[int, int] = field(default_factory=dict)  # node -> position in `nodes`
    cls_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    members: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # positions
    ranked: list[tuple[int, int]] = field(default_factory=list)  # (free, first member)

    def __post_init__(self) -> None:
        self.order = {x: i for i, x in enumerate(self.nodes)}

    def move(self, x: int, new: tuple[int, int] | None) -> None:
        """Node x now belongs to class `new` (None: no room for a worker)."""
        old = self.cls_of.pop(x, None)
        if old == new:
            if new is not None:
                self.cls_of[x] = new
            return
        at = self.order[x]
        if old is not None:
            ords = self.members[old]
            first = ords[0]
            del ords[bisect.bisect_left(ords, at)]
            if first == at:
                self.ranked.remove((old[0], x))
                if ords:
                    bisect.insort(self.ranked, (old[0], self.nodes[ords[0]]))
                else:
                    del self.members[old]
        if new is not None:
            self.cls_of[x] = new
            ords = self.members.setdefault(new, [])
            lead = ords[0] if ords else None
            bisect.insort(ords, at)
            if ords[0] != lead:
                if lead is not None:
                    self.ranked.remove((new[0], self.nodes[lead]))
                bisect.insort(self.ranked, (new[0], x))


_Domains = dict[tuple[str, ...], list[int]]  # a domain's key -> its candidate nodes
_Layout = tuple[int, tuple[int, ...], tuple[int, ...]]  # group, fixed and domain levels
# A candidate domain's tightness (instances of the group that fit, free GPUs, first node) and
# its nodes with room for one worker.
_Ranked = tuple[tuple[int, int, int], list[int]]


@dataclass
class _Fleet:
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
    scan: _Scan
    base: bool
    sigs: list[int] = field(default_factory=list)  # filled on demand, -1 until then
    sig_ids: dict[tuple[object, ...], int] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)  # group indices, placement order
    plan: _Plan | None = None
    stats: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    # (together domain, step layout) -> fixed rules' values -> domain key -> nodes
    buckets: dict[tuple[str, _Layout], dict[tuple[str, ...], _Domains]] = field(
        default_factory=dict
    )
    # (together domain, group, level) -> domain at that level -> the group's nodes with room
    by_rule: dict[tuple[str, int, int], dict[str, list[int]]] = field(default_factory=dict)
    # Every node whose free count the search changed, in order: a step's ranked domains are
    # brought up to date from it (only the domains of nodes changed since are ranked again).
    changed: list[int] = field(default_factory=list)
    ranked: dict[tuple[object, ...], tuple[int, dict[tuple[str, ...], _Ranked]]] = field(
        default_factory=dict
    )
    hosts: dict[tuple[object, ...], tuple[int, _Classes]] = field(default_factory=dict)

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
class _Scan:
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
    # for every fleet of this scan, whatever gates hold (see _group_counts).
    rarity: dict[bool, list[tuple[int, int]]] = field(default_factory=dict)


def _levels(shape: ShapeRequest) -> tuple[Level, ...]:
    """The levels a shape's search tells apart. Host keys tell nodes apart only where a rule
    asks for one host (a connect rule or `together` at host); elsewhere a host-level group's
    domain is just its node."""
    groups, pair = shape.group_list, shape.pair_level
    host_matters = "host" in {c.level for c in shape.connect} or pair == "host"
    in_play = {pair, *(g.level for g in groups), *(c.level for c in shape.connect)}
    return tuple(lv for lv in LEVELS if lv in in_play and (lv != "host" or host_matters))


def scan(nodes: Sequence[Node], shape: ShapeRequest) -> _Scan:
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
    return _Scan(
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


def _project(s: _Scan, sub: ShapeRequest) -> _Scan:
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
        return _Scan(
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
    return _Scan(
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


def fleet(s: _Scan, held: Iterable[GpuKey], base: bool) -> _Fleet:
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
    return _Fleet(
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


def build(nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey], base: bool) -> _Fleet:
    """`scan`, then `fleet`: the nodes of a shape with their free counts."""
    return fleet(scan(nodes, shape), held, base)


# -- counting ------------------------------------------------------------------------------------


def _instances(
    f: _Fleet, members: Sequence[int], g: int, free: Sequence[int] | None = None
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


def _group_counts(f: _Fleet) -> None:
    """The placement order: most constrained in the inventory first (fewest domains that hold
    one, fewest instances, on the GPUs no other workload uses, whatever gates hold: so the
    order is the same for every allocation from this inventory), then most GPUs, most nodes,
    the order written."""
    width = range(len(f.groups))
    rare = f.scan.rarity.get(f.base)
    if rare is None:
        tally = [[0, 0] for _ in width]
        for members in f.pairs.values():
            for g in width:
                d, c = _instances(f, members, g, f.usable)
                tally[g][0] += d
                tally[g][1] += c
        rare = f.scan.rarity[f.base] = [(d, c) for d, c in tally]
    f.order = sorted(width, key=lambda g: (*rare[g], -f.groups[g].gpus, -f.groups[g].nodes, g))
    f.plan = _Plan.of(f)


def _stats(f: _Fleet, p: str) -> tuple[list[int], list[int]]:
    """Each group alone in `together` domain p: (domains of its level holding one, instances).
    Read when p is first bounded, before any search in p moves its free counts."""
    got = f.stats.get(p)
    if got is None:
        members = f.pairs[p]
        counts = [_instances(f, members, g) for g in range(len(f.groups))]
        got = f.stats[p] = ([d for d, _ in counts], [c for _, c in counts])
    return got


def _bound(f: _Fleet, p: str, headroom: bool) -> int:
    """An upper bound on the gates domain p holds now (0 skips its search)."""
    shape, members, free = f.shape, f.pairs[p], f.free
    roles, per_gate = len(shape.roles), shape.gpus_per_gate
    total = sum(free[i] for i in members)
    ub = total // per_gate
    if headroom and shape.headroom_gpus:
        ub = min(ub, max(0, total - shape.headroom_gpus) // per_gate)
    ub = min([ub, *(c // roles for c in _stats(f, p)[1])])
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
        idx = [_index(f, r) for r in rule.groups]
        # In each of the rule's domains: each group alone, and all of them on its free GPUs
        # (one engine's groups under the rule share the domain, on disjoint GPUs).
        bits = sum(1 << g for g in idx)
        need = sum(f.groups[g].gpus for g in idx)
        engines = sum(
            min(
                sum(free[i] for i in nodes if f.mask[i] & bits) // need,
                *(_instances(f, nodes, g)[1] for g in idx),
            )
            for nodes in by.values()
        )
        ub = min(ub, engines // roles)
        if ub == 0:
            return 0
    return ub


def _index(f: _Fleet, role: str) -> int:
    return next(j for j, g in enumerate(f.groups) if g.role == role)


# -- the search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """One position of the search: a group of one engine, and how its rules stand there.
    Levels are indices into the fleet's levels, only those below `together` (inside one
    `together` domain the others hold by themselves)."""

    group: int
    engine: int
    gpn: int
    nodes: int
    host: bool  # the group's level is host: each candidate node is a domain of its own
    fixed: tuple[int, ...]  # connect rules an earlier group of this engine already placed
    unfixed: tuple[int, ...]  # connect rules this group places first (it fixes their domain)
    fixed_levels: tuple[int, ...]
    domain_levels: tuple[int, ...]  # the group's level, then its unfixed rules' levels
    unfixed_levels: tuple[int, ...]
    # The groups of this engine still to place under a rule this step fixes: (group, rule
    # level, GPUs per node, nodes), checked as soon as the rule's domain is chosen.
    peers: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def layout(self) -> _Layout:
        return (self.group, self.fixed_levels, self.domain_levels)


@dataclass(frozen=True)
class _Plan:
    steps: tuple[_Step, ...]

    @classmethod
    def of(cls, f: _Fleet) -> _Plan:
        """Both engines' instances of the rarest group, then the next group's, and so on."""
        top = level_index(f.shape.pair_level)
        rules = [
            (c, {_index(f, name) for name in rule.groups}, f.lvl(rule.level))
            for c, rule in enumerate(f.shape.connect)
            if level_index(rule.level) < top  # at or above `together`: holds by itself
        ]
        positions = [(g, r) for g in f.order for r in range(len(f.shape.roles))]
        steps = []
        for i, (g, r) in enumerate(positions):
            before = {h for h, e in positions[:i] if e == r}
            mine = [(c, li) for c, gs, li in rules if g in gs]
            fixed = [(c, li) for c, li in mine if any(gs & before for d, gs, _ in rules if d == c)]
            unfixed = [(c, li) for c, li in mine if (c, li) not in fixed]
            later = {h for h, e in positions[i + 1 :] if e == r}
            peers = tuple(
                (h, li, f.groups[h].gpus_per_node, f.groups[h].nodes)
                for c, li in unfixed
                for d, gs, _ in rules
                if d == c
                for h in sorted(gs & later)
            )
            grp = f.groups[g]
            below = grp.level != "host" and level_index(grp.level) < top
            own = (f.lvl(grp.level),) if below else ()
            steps.append(
                _Step(
                    g,
                    r,
                    grp.gpus_per_node,
                    grp.nodes,
                    grp.level == "host" and top > 0,
                    tuple(c for c, _ in fixed),
                    tuple(c for c, _ in unfixed),
                    tuple(li for _, li in fixed),
                    own + tuple(li for _, li in unfixed),
                    tuple(li for _, li in unfixed),
                    peers,
                )
            )
        return cls(tuple(steps))


@dataclass
class _Search:
    """Depth-first placement of one gate in one `together` domain (see the module docstring)."""

    f: _Fleet
    pair: str
    budget: int = 0
    chosen: list[list[int]] = field(default_factory=list)
    width: int = 0  # node sets tried per domain (0: all of them)
    keep: bool = False  # keep candidates across searches (large domains; see _ranked)

    def __post_init__(self) -> None:
        assert self.f.plan is not None
        self.keep = len(self.f.pairs[self.pair]) > PRUNE_FROM
        n = len(self.f.plan.steps)
        self.chosen = [[] for _ in range(n)]
        # One straight descent (each step examines at most every node and every domain of
        # the `together` domain once, and tries one set) is always allowed; SEARCH_BUDGET
        # bounds the backtracking.
        self.budget = SEARCH_BUDGET + n * (2 * len(self.f.pairs[self.pair]) + 1)

    def _bucket(self, step: _Step) -> dict[tuple[str, ...], _Domains]:
        """A step's candidates: by the values of its fixed connect rules, its domains, each
        with the group's eligible nodes that have room for one of its workers. Built once per
        domain and layout (both engines' steps share it), before the search moves anything:
        within one call free GPUs only fall (a search restores what it tries), so a node
        without room now never gets it back, and `prune` drops those a placed gate filled."""
        f = self.f
        got = f.buckets.get((self.pair, step.layout))
        if got is not None:
            return got
        fl, dl, bit, gpn = step.fixed_levels, step.domain_levels, 1 << step.group, step.gpn
        keys, mask, free = f.keys, f.mask, f.free
        out: dict[tuple[str, ...], _Domains] = {}
        members = [x for x in f.pairs[self.pair] if mask[x] & bit and free[x] >= gpn]
        if not fl and not dl:
            out[()] = {(): members}
        else:
            for x in members:
                k = keys[x]
                doms = out.setdefault(tuple([k[j] for j in fl]), {})
                doms.setdefault(tuple([k[j] for j in dl]), []).append(x)
        n = step.nodes
        for doms in out.values():  # a domain short of nodes with room stays so in this call
            for dk in [dk for dk, xs in doms.items() if len(xs) < n]:
                del doms[dk]
        f.buckets[(self.pair, step.layout)] = out
        return out

    def prune(self) -> None:
        """After a gate is placed: drop the nodes it left without room from the candidates of
        the next search in this domain."""
        f = self.f
        assert f.plan is not None
        done: set[_Layout] = set()
        touched = {x for chosen in self.chosen for x in chosen}
        for step in f.plan.steps:
            if step.layout in done:
                continue
            done.add(step.layout)
            bucket = f.buckets.get((self.pair, step.layout))
            if bucket is None:
                continue
            for x in touched:
                if f.free[x] >= step.gpn or not f.mask[x] & (1 << step.group):
                    continue
                k = f.keys[x]
                doms = bucket.get(tuple([k[j] for j in step.fixed_levels]))
                dk = tuple([k[j] for j in step.domain_levels])
                xs = doms.get(dk) if doms else None
                if doms is not None and xs is not None and x in xs:
                    xs.remove(x)
                    if len(xs) < step.nodes:
                        del doms[dk]

    def run(self) -> bool:
        assert self.f.plan is not None
        for step in self.f.plan.steps:
            self._bucket(step)  # from the committed free counts (see _bucket)
            for h, li, _, _ in step.peers:
                self._by_rule(h, li)
        steps = self.f.plan.steps
        try:
            # First only the best-fit node set of every candidate domain (which domain each
            # group goes to is the choice a greedy order gets wrong), then every node set.
            for self.width in (1, 0):
                if self._dfs(0, steps, [{} for _ in self.f.shape.roles]):
                    return True
        except _OutOfBudget:
            pass
        return False

    def _options(self, step: _Step, doms: _Domains, fixed: tuple[str, ...]) -> Iterator[list[int]]:
        """Node sets for this step, best fit first: candidate domains tightest first, and in
        each the ways of drawing from its classes of interchangeable nodes. Charges the
        budget one unit per candidate node examined."""
        n = step.nodes
        if step.host:
            # Every node is a domain of its own: one try per class of interchangeable nodes,
            # the tightest first.
            self._charge(sum(map(len, doms.values())))
            for x in self._hosts(step, doms, fixed):
                yield [x]
            return
        self._charge(len(doms))
        for xs in self._ranked(step, doms, fixed):
            self._charge(len(xs))
            if self.width:
                yield from itertools.islice(self._node_sets(xs, n), self.width)
            else:
                yield from self._node_sets(xs, n)

    def _hosts(self, step: _Step, doms: _Domains, fixed: tuple[str, ...]) -> list[int]:
        """A host-level step's candidates: the first node (in the candidates' order) of each
        class of interchangeable nodes with room (same free GPUs, same signature), tightest
        first. Kept across searches like `_ranked`: only nodes changed since are moved."""
        f, gpn = self.f, step.gpn
        free, sig = f.free, f.sig
        if not self.keep:  # a small domain: a fresh look costs less than keeping one
            firsts: dict[tuple[int, int], int] = {}
            sigs = f.sigs
            for xs in doms.values():
                for x in xs:
                    fx = free[x]
                    if fx >= gpn:
                        firsts.setdefault((fx, sigs[x] if sigs[x] >= 0 else sig(x)), x)
            return sorted(firsts.values(), key=lambda x: (free[x], x))
        key = (self.pair, step.layout, gpn, fixed)
        got = f.hosts.get(key)
        if got is None:
            st = _Classes([x for xs in doms.values() for x in xs])
            for x in st.nodes:
                if free[x] >= gpn:
                    st.cls_of[x] = c = (free[x], sig(x))
                    st.members.setdefault(c, []).append(st.order[x])
            st.ranked = sorted((c[0], st.nodes[ords[0]]) for c, ords in st.members.items())
        else:
            seen, st = got
            for x in {x for x in f.changed[seen:] if x in st.order}:
                st.move(x, (free[x], sig(x)) if free[x] >= gpn else None)
        f.hosts[key] = (len(f.changed), st)
        return [x for _, x in st.ranked]

    def _ranked(self, step: _Step, doms: _Domains, fixed: tuple[str, ...]) -> list[list[int]]:
        """The step's candidate domains with room for the group (their nodes with room for a
        worker), the tightest first: fewest instances of the group fit, fewest free GPUs.
        On a large `together` domain (hundreds of candidates, a gate changes a handful of
        nodes) the ranking is kept per domain and layout across searches: only the domains
        of nodes whose free counts changed since the last call are ranked again."""
        f, gpn, n = self.f, step.gpn, step.nodes
        free = f.free

        def tightness(xs: list[int]) -> tuple[int, int, int]:
            slots = [free[x] // gpn for x in xs]
            fits = sum(slots) if n == 1 else engine_capacity(slots, n)
            return (fits, sum([free[x] for x in xs]), xs[0])

        def with_room(all_xs: list[int]) -> list[int] | None:
            if len(all_xs) < n:
                return None
            xs = [x for x in all_xs if free[x] >= gpn]
            return xs if len(xs) >= n else None

        if not self.keep:  # a small domain: a fresh look costs less than keeping one
            options = [xs for all_xs in doms.values() if (xs := with_room(all_xs))]
            if len(options) > 1:
                options.sort(key=tightness)
            return options
        key = (self.pair, step.layout, step.gpn, step.nodes, fixed)
        got = f.ranked.get(key)
        if got is None:
            out = {dk: (tightness(xs), xs) for dk, a in doms.items() if (xs := with_room(a))}
        else:
            seen, out = got
            dl, keys = step.domain_levels, f.keys
            for dk in {tuple([keys[x][j] for j in dl]) for x in f.changed[seen:]}:
                all_xs = doms.get(dk)
                xs = with_room(all_xs) if all_xs is not None else None
                if xs is None:
                    out.pop(dk, None)
                else:
                    out[dk] = (tightness(xs), xs)
        f.ranked[key] = (len(f.changed), out)
        return [xs for _, xs in sorted(out.values())]

    def _charge(self, units: int) -> None:
        self.budget -= units
        if self.budget < 0:
            raise _OutOfBudget

    def _dfs(self, i: int, steps: tuple[_Step, ...], values: list[dict[int, str]]) -> bool:
        if i == len(steps):
            return True
        f, step = self.f, steps[i]
        r, gpn = step.engine, step.gpn
        mine = values[r]
        fixed = tuple([mine[c] for c in step.fixed])
        doms = self._bucket(step).get(fixed, {})
        free, keys, changed, keep = f.free, f.keys, f.changed, self.keep
        for chosen in self._options(step, doms, fixed):
            self._charge(1)
            for x in chosen:
                free[x] -= gpn
            if keep:
                changed.extend(chosen)
            if step.unfixed:
                lead = keys[chosen[0]]
                for c, li in zip(step.unfixed, step.unfixed_levels, strict=True):
                    mine[c] = lead[li]
            if self._peers_fit(step, keys[chosen[0]]) and self._dfs(i + 1, steps, values):
                self.chosen[i] = chosen
                return True
            for c in step.unfixed:
                del mine[c]
            for x in chosen:
                free[x] += gpn
            if keep:
                changed.extend(chosen)
        return False

    def _peers_fit(self, step: _Step, lead: tuple[str, ...]) -> bool:
        """The domain a rule was just fixed to still has, for each group of the same engine
        still to place under it, enough nodes with room for one of its workers (a forward
        check: a greedy choice that strands a connected group is left at once)."""
        free = self.f.free
        for h, li, gpn, n in step.peers:
            xs = self._by_rule(h, li).get(lead[li], ())
            self._charge(len(xs))
            if sum(1 for x in xs if free[x] >= gpn) < n:
                return False
        return True

    def _by_rule(self, h: int, li: int) -> dict[str, list[int]]:
        """Group h's nodes with room in this `together` domain, by their domain at level li
        (built with the buckets, from the committed free counts)."""
        f = self.f
        got = f.by_rule.get((self.pair, h, li))
        if got is None:
            gpn, bit, free, keys, mask = f.groups[h].gpus_per_node, 1 << h, f.free, f.keys, f.mask
            got = {}
            for x in f.pairs[self.pair]:
                if mask[x] & bit and free[x] >= gpn:
                    got.setdefault(keys[x][li], []).append(x)
            f.by_rule[(self.pair, h, li)] = got
        return got

    def _node_sets(self, xs: list[int], n: int) -> Iterator[list[int]]:
        """Node sets of size n from xs, one per way of drawing from classes of
        interchangeable nodes: the best fit first (see the module docstring)."""
        f = self.f
        classes: dict[tuple[int, int], list[int]] = {}
        free, sigs, sig = f.free, f.sigs, f.sig
        for x in xs:
            classes.setdefault((free[x], sigs[x] if sigs[x] >= 0 else sig(x)), []).append(x)
        ordered = sorted(classes.values(), key=lambda c: (f.free[c[0]], c[0]))
        if n == 1:
            for c in ordered:
                yield [c[0]]
            return
        sizes = [len(c) for c in ordered]
        roomy: list[int] = []
        left = n
        for k in range(len(sizes) - 1, -1, -1):
            take = min(sizes[k], left)
            roomy.append(take)
            left -= take
        first = tuple(reversed(roomy + [0] * (len(sizes) - len(roomy))))
        yield _draw(ordered, first)
        for counts in _count_vectors(sizes, n):
            if counts != first:
                yield _draw(ordered, counts)


def _draw(classes: list[list[int]], counts: tuple[int, ...]) -> list[int]:
    """The nodes a draw takes, the roomiest class first (its first node leads the group)."""
    out: list[int] = []
    for c, k in zip(reversed(classes), reversed(counts), strict=True):
        out.extend(c[:k])
    return out


# -- the three questions -------------------------------------------------------------------------


def _fit(f: _Fleet, p: str, gates: int) -> DomainFit:
    members = f.pairs[p]
    return DomainFit(
        domain_of(f.nodes[members[0]], f.shape.pair_level),
        len(members),
        sum(f.free[i] for i in members),
        gates * len(f.shape.roles),
        gates,
    )


def _count(f: _Fleet, headroom: bool = True) -> dict[str, DomainFit]:
    """Gates per `together` domain, placed one after another as allocate() would place them
    (mutates f.free), up to the domain's bound: a further search could only fail."""
    out: dict[str, DomainFit] = {}
    roles = len(f.shape.roles)
    for p in f.pairs:
        fit = _fit(f, p, 0)
        ub, gates = _bound(f, p, headroom), 0
        while gates < ub:
            search = _Search(f, p)
            if not search.run():
                break
            if len(f.pairs[p]) > PRUNE_FROM:
                search.prune()
            gates += 1
        out[p] = fit._replace(gates=gates, engines=gates * roles) if gates else fit
    return out


def _sorted_fits(found: Iterable[DomainFit]) -> tuple[DomainFit, ...]:
    return tuple(sorted(sorted(found), key=itemgetter(4), reverse=True))


def _group_fits(f: _Fleet) -> tuple[GroupFit, ...]:
    """Each group alone across the fleet (before anything is placed)."""
    stats = [_stats(f, p) for p in f.pairs]
    out = []
    for g in f.order:
        bit = 1 << g
        nodes = [i for i in range(len(f.nodes)) if f.mask[i] & bit]
        out.append(
            GroupFit(
                f.groups[g].role,
                len(nodes),
                sum(f.free[i] for i in nodes),
                sum(s[0][g] for s in stats),
                sum(s[1][g] for s in stats),
            )
        )
    return tuple(out)


def capacity_groups(
    nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey] = ()
) -> Capacity:
    f = build(nodes, shape, held, base=False)
    _group_counts(f)
    groups = _group_fits(f)
    fits = _sorted_fits(_count(f).values())
    return Capacity(
        gates=sum(x.gates for x in fits),
        engines=sum(x.engines for x in fits),
        free_gpus=sum(x.free_gpus for x in fits),
        eligible_nodes=len(f.nodes),
        level=shape.pair_level,
        per_domain=fits,
        groups=groups,
    )


def allocate_groups(
    nodes: Sequence[Node], shape: ShapeRequest, held: Iterable[GpuKey] = ()
) -> Placement | Blocked:
    held = set(held)
    f = build(nodes, shape, held, base=False)
    for g in shape.group_list:
        if not any(f.mask[i] & (1 << _index(f, g.role)) for i in range(len(f.nodes))):
            return _ineligible(nodes, shape, g)
    _group_counts(f)
    options = []
    for p, members in f.pairs.items():
        ub = _bound(f, p, headroom=True)
        if ub:
            options.append((ub, sum(f.free[i] for i in members), members[0], p))
    # Best fit: the domain with the fewest gates' room first, so large domains stay whole.
    for *_, p in sorted(options):
        s = _Search(f, p)
        if s.run():
            return _placement(f, s, p)
    return _diagnose(shape, held, f)


def _placement(f: _Fleet, s: _Search, p: str) -> Placement:
    """GPU indices for the counts the search chose: each node's lowest free ones, in order."""
    lists: dict[int, list[int]] = {}
    got: dict[tuple[int, int], GroupPlacement] = {}
    assert f.plan is not None
    for step, chosen in zip(f.plan.steps, s.chosen, strict=True):
        g, r = step.group, step.engine
        grp = f.groups[g]
        per_node = []
        for x in chosen:
            if x not in lists:
                taken = f.held.get(f.nodes[x].name, set())
                lists[x] = [k for k in range(f.usable[x]) if k not in taken]
            per_node.append(tuple(lists[x][: grp.gpus_per_node]))
            lists[x] = lists[x][grp.gpus_per_node :]
        lead = f.nodes[chosen[0]]
        got[(g, r)] = GroupPlacement(
            grp.role,
            tuple(f.nodes[x].name for x in chosen),
            tuple(per_node),
            lead.normalised_sku,
            domain_of(lead, grp.level),
        )
    engines = []
    domain = domain_of(f.nodes[f.pairs[p][0]], f.shape.pair_level)
    for r, role in enumerate(f.shape.roles):
        groups = tuple(got[(g, r)] for g in range(len(f.groups)))
        workers = tuple(w for gp in groups for w in gp.workers)
        engines.append(EnginePlacement(role, workers, groups[0].sku, domain, groups))
    return Placement(tuple(engines), domain)


# -- why not -------------------------------------------------------------------------------------


def _ineligible(nodes: Sequence[Node], shape: ShapeRequest, g: GroupRequest) -> Blocked:
    _, eliminated, stage = eligible(nodes, shape, g.sku, g.min_gpu_memory_gib)
    assert stage is not None
    msg = stage_message(stage, shape, g.sku, g.min_gpu_memory_gib)
    return Blocked(stage, f"{g.role} group: {msg}", eliminated, RETRYABLE[stage])


def _fits_anywhere(s: _Scan, held: set[GpuKey], base: bool, headroom: bool) -> bool:
    f = fleet(s, held, base)
    _group_counts(f)
    return any(_bound(f, p, headroom) and _Search(f, p).run() for p in sorted(f.pairs))


def _sub_shape(
    shape: ShapeRequest, roles: Sequence[str], rules: Sequence[ConnectRule]
) -> ShapeRequest:
    """The shape with only these groups and rules (for finding which layer blocks)."""
    keep = set(roles)
    return replace(
        shape,
        groups=tuple(g for g in shape.group_list if g.role in keep),
        connect=tuple(rules),
        together=shape.pair_level,
        headroom_gpus=0,
    )


def _restricted(shape: ShapeRequest, roles: Sequence[str]) -> list[ConnectRule]:
    keep = set(roles)
    out = []
    for rule in shape.connect:
        names = tuple(n for n in rule.groups if n in keep)
        if len(names) >= 2:
            out.append(ConnectRule(names, rule.level))
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _topology_message(whole: _Scan, held: set[GpuKey], order: Sequence[str]) -> str:
    """Name the group and the layer that fails: add groups in placement order; the first that
    does not fit beside the ones before it is the one, and its own level, then its connect
    rules, then the competition for GPUs is the layer."""
    shape = whole.shape
    free_fleet = fleet(whole, held, base=False)

    def fits(sub: ShapeRequest) -> bool:
        return _fits_anywhere(_project(whole, sub), held, False, False)

    by_role = {g.role: g for g in shape.group_list}
    t, roles = shape.pair_level, len(shape.roles)
    for k in range(1, len(order) + 1):
        prefix = list(order[:k])
        role = prefix[-1]
        g = by_role[role]
        rules = _restricted(shape, prefix)
        if fits(_sub_shape(shape, prefix, rules)):
            continue
        need = f"{_plural(g.nodes, 'node')} with {g.gpus_per_node} free GPUs"
        if not fits(_sub_shape(shape, [role], [])):
            most = _largest(free_fleet, g, g.level, ())
            if most < g.nodes:
                return (
                    f"{role} group needs {need} in one {g.level}; the largest {g.level} has {most}"
                )
            return (
                f"{role} group needs {roles} copies ({need} in one {g.level} each) in one {t}; "
                f"no {t} holds {roles}"
            )
        mine = [c for c in rules if role in c.groups]
        others = [c for c in rules if role not in c.groups]
        if fits(_sub_shape(shape, prefix, others)):
            for rule in mine:
                if not fits(_sub_shape(shape, prefix, [*others, rule])):
                    peers = [n for n in rule.groups if n != role]
                    names = " and ".join(peers)
                    most = _largest(free_fleet, g, rule.level, [by_role[n] for n in peers])
                    if most < g.nodes:
                        return (
                            f"{role} group needs {_plural(g.nodes, 'node')} in one {rule.level} "
                            f"with {names}; the largest {rule.level} with free {names} capacity "
                            f"has {most}"
                        )
                    return (
                        f"{role} group needs {_plural(g.nodes, 'node')} in one {rule.level} with "
                        f"{names}, for {roles} engines in one {t}; no {t} has room for that"
                    )
        placed = ", ".join(prefix[:-1])
        return (
            f"{role} group ({need} in one {g.level}) fits alone and so does {placed}, but not "
            f"beside it: they need the same free GPUs in every {t}"
        )
    return f"no {t} domain holds every group of {roles} engines"


def _largest(f: _Fleet, g: GroupRequest, level: Level, peers: Sequence[GroupRequest]) -> int:
    """The most nodes with room for a worker of g in one domain of `level` (inside one domain of
    g's own level) among the domains where every peer group has room for one instance."""
    gi = _index(f, g.role)
    pair = f.shape.pair_level
    by: dict[tuple[str, str], list[int]] = {}
    for i in range(len(f.nodes)):
        by.setdefault((f.key(i, pair), f.key(i, level)), []).append(i)
    best = 0
    for members in by.values():
        if any(_instances(f, members, _index(f, h.role))[1] < 1 for h in peers):
            continue
        counts: dict[str, int] = {}
        for i in members:
            if f.mask[i] & (1 << gi) and f.free[i] >= g.gpus_per_node:
                own = f.key(i, g.level)
                counts[own] = counts.get(own, 0) + 1
        best = max([best, *counts.values()])
    return best


def _diagnose(shape: ShapeRequest, held: set[GpuKey], f: _Fleet) -> Blocked:
    """Nothing fits: the first later stage that explains it, relaxing one layer at a time (no
    leases, then no headroom rule, then the groups one by one)."""
    roles = len(shape.roles)
    fits = _sorted_fits(_fit(f, p, 0) for p in f.pairs)
    out = dict(f.eliminated)
    whole = f.scan
    no_leases = fleet(whole, (), base=False)
    smallest = min(g.gpus_per_node for g in shape.group_list)
    out["free_capacity"] = sum(1 for v in no_leases.free if v < smallest)
    empty = fleet(whole, (), base=True)
    for g in shape.group_list:
        bit = 1 << _index(f, g.role)
        have = sum(v for v, m in zip(no_leases.free, no_leases.mask, strict=True) if m & bit)
        if have < roles * g.gpus:
            could = sum(v for v, m in zip(empty.free, empty.mask, strict=True) if m & bit)
            return Blocked(
                "free_capacity",
                f"{have} GPUs are free on the nodes eligible for the {g.role} group; it needs "
                f"{roles * g.gpus} ({roles} engines x {g.gpus})",
                out,
                could >= roles * g.gpus,
                fits,
            )
    free_total = sum(no_leases.free)
    if free_total < shape.gpus_per_gate:
        return Blocked(
            "free_capacity",
            f"{free_total} GPUs are free on the eligible nodes; the gate needs "
            f"{shape.gpus_per_gate} ({roles} engines x {shape.engine_gpus})",
            out,
            sum(empty.free) >= shape.gpus_per_gate,
            fits,
        )
    if not _fits_anywhere(whole, set(), False, headroom=False):
        out["topology"] = len(f.nodes)
        possible = _fits_anywhere(whole, set(), True, headroom=False)
        order = [shape.group_list[g].role for g in f.order]
        msg = _topology_message(whole, set(), order)
        if not possible:
            level = shape.pair_level
            never = f"no {level} domain of this fleet" if level != "any" else "this fleet"
            msg = f"{never} can never hold this shape: {msg}"
        return Blocked("topology", msg, out, possible, fits)
    if not _fits_anywhere(whole, set(), False, headroom=True):
        out["transition_headroom"] = len(f.nodes)
        return headroom_blocked(shape, out, fits)
    out["lease_conflict"] = len(f.nodes)
    held_here = sum(1 for x in f.nodes for g in range(x.gpus) if (x.name, g) in held)
    return lease_blocked(held_here, out, fits)
