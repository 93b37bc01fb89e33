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

Where. This module answers the three questions (capacity, placement, blocked) from its parts:
`groups_fleet.py` reads the inventory (the scan, the fleet of free counts, each group alone and
the bounds), `groups_search.py` orders the groups and searches (the plan, the search, gates
counted one after another), `groups_blocked.py` says why not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gate.reservations.groups_blocked import diagnose, ineligible
from gate.reservations.groups_fleet import Fleet, bound, build, group_stats, index_of, sorted_fits
from gate.reservations.groups_search import Search, count_gates, order_groups
from gate.reservations.inventory import Node
from gate.reservations.shapes import (
    Blocked,
    Capacity,
    EnginePlacement,
    GpuKey,
    GroupFit,
    GroupPlacement,
    Placement,
    ShapeRequest,
    domain_of,
)


def _group_fits(f: Fleet) -> tuple[GroupFit, ...]:
    """Each group alone across the fleet (before anything is placed)."""
    stats = [group_stats(f, p) for p in f.pairs]
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
    order_groups(f)
    groups = _group_fits(f)
    fits = sorted_fits(count_gates(f).values())
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
        if not any(f.mask[i] & (1 << index_of(f, g.role)) for i in range(len(f.nodes))):
            return ineligible(nodes, shape, g)
    order_groups(f)
    options = []
    for p, members in f.pairs.items():
        ub = bound(f, p, headroom=True)
        if ub:
            options.append((ub, sum(f.free[i] for i in members), members[0], p))
    # Best fit: the domain with the fewest gates' room first, so large domains stay whole.
    for *_, p in sorted(options):
        s = Search(f, p)
        if s.run():
            return _placement(f, s, p)
    return diagnose(shape, held, f)


def _placement(f: Fleet, s: Search, p: str) -> Placement:
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
