"""Why a multi-group shape does not fit: the first later stage that explains it.

Nothing fits: relax one layer at a time (no leases, no headroom rule, the groups one by one in
placement order, then each connect rule), every relaxed shape read as a projection of the one
scan of the inventory (`groups_fleet.project`), and name the group and the layer that fails.
No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gate.reservations.groups_fleet import (
    Fleet,
    Scan,
    bound,
    domain_fit,
    fleet,
    index_of,
    instances,
    project,
    sorted_fits,
)
from gate.reservations.groups_search import Search, order_groups
from gate.reservations.inventory import Node
from gate.reservations.shapes import (
    RETRYABLE,
    Blocked,
    ConnectRule,
    GpuKey,
    GroupRequest,
    Level,
    ShapeRequest,
    eligible,
    headroom_blocked,
    lease_blocked,
    stage_message,
)


def ineligible(nodes: Sequence[Node], shape: ShapeRequest, g: GroupRequest) -> Blocked:
    _, eliminated, stage = eligible(nodes, shape, g.sku, g.min_gpu_memory_gib)
    assert stage is not None
    msg = stage_message(stage, shape, g.sku, g.min_gpu_memory_gib)
    return Blocked(stage, f"{g.role} group: {msg}", eliminated, RETRYABLE[stage])


def _fits_anywhere(s: Scan, held: set[GpuKey], base: bool, headroom: bool) -> bool:
    f = fleet(s, held, base)
    order_groups(f)
    return any(bound(f, p, headroom) and Search(f, p).run() for p in sorted(f.pairs))


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


def _topology_message(whole: Scan, held: set[GpuKey], order: Sequence[str]) -> str:
    """Name the group and the layer that fails: add groups in placement order; the first that
    does not fit beside the ones before it is the one, and its own level, then its connect
    rules, then the competition for GPUs is the layer."""
    shape = whole.shape
    free_fleet = fleet(whole, held, base=False)

    def fits(sub: ShapeRequest) -> bool:
        return _fits_anywhere(project(whole, sub), held, False, False)

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


def _largest(f: Fleet, g: GroupRequest, level: Level, peers: Sequence[GroupRequest]) -> int:
    """The most nodes with room for a worker of g in one domain of `level` (inside one domain of
    g's own level) among the domains where every peer group has room for one instance."""
    gi = index_of(f, g.role)
    pair = f.shape.pair_level
    by: dict[tuple[str, str], list[int]] = {}
    for i in range(len(f.nodes)):
        by.setdefault((f.key(i, pair), f.key(i, level)), []).append(i)
    best = 0
    for members in by.values():
        if any(instances(f, members, index_of(f, h.role))[1] < 1 for h in peers):
            continue
        counts: dict[str, int] = {}
        for i in members:
            if f.mask[i] & (1 << gi) and f.free[i] >= g.gpus_per_node:
                own = f.key(i, g.level)
                counts[own] = counts.get(own, 0) + 1
        best = max([best, *counts.values()])
    return best


def diagnose(shape: ShapeRequest, held: set[GpuKey], f: Fleet) -> Blocked:
    """Nothing fits: the first later stage that explains it, relaxing one layer at a time (no
    leases, then no headroom rule, then the groups one by one)."""
    roles = len(shape.roles)
    fits = sorted_fits(domain_fit(f, p, 0) for p in f.pairs)
    out = dict(f.eliminated)
    whole = f.scan
    no_leases = fleet(whole, (), base=False)
    smallest = min(g.gpus_per_node for g in shape.group_list)
    out["free_capacity"] = sum(1 for v in no_leases.free if v < smallest)
    empty = fleet(whole, (), base=True)
    for g in shape.group_list:
        bit = 1 << index_of(f, g.role)
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
