"""Inventories and multi-group shapes for the tests of gate/reservations/groups*.py: a node
maker, the prefill/decode shape, hypothesis strategies of random fleets and shapes, held GPUs,
and what a valid placement is, checked from the inventory alone (never from the allocator's own
structures)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from gate.reservations.allocator import (
    LEVELS,
    ROLES,
    ConnectRule,
    GroupRequest,
    Level,
    Placement,
    ShapeRequest,
    domain_of,
)
from gate.reservations.inventory import Node, normalise_sku

GpuKey = tuple[str, int]


def node(name: str, gpus: int = 8, sku: str = "NVIDIA-H200", **kw: Any) -> Node:
    kw.setdefault("gpu_memory_gib", 141)
    return Node(name=name, sku=sku, gpus=gpus, **kw)


def pd_shape(
    prefill: tuple[int, int, Level] = (4, 1, "host"),
    decode: tuple[int, int, Level] = (8, 2, "clique"),
    connect: Level | None = "clique",
    **kw: Any,
) -> ShapeRequest:
    rules = (ConnectRule(("prefill", "decode"), connect),) if connect else ()
    return ShapeRequest(
        groups=(GroupRequest("prefill", *prefill), GroupRequest("decode", *decode)),
        connect=rules,
        **kw,
    )


def eligible_for(x: Node, shape: ShapeRequest, g: GroupRequest) -> bool:
    if shape.regions and x.region not in shape.regions:
        return False
    if shape.providers and x.provider not in shape.providers:
        return False
    if shape.pools and x.pool not in shape.pools:
        return False
    if g.sku and normalise_sku(x.sku) != normalise_sku(g.sku):
        return False
    if g.min_gpu_memory_gib is not None and x.gpu_memory_gib < g.min_gpu_memory_gib:
        return False
    return x.healthy and not x.cordoned and not x.taints


def free_gpus(fleet: Sequence[Node], held: set[GpuKey]) -> dict[str, int]:
    out = {}
    for x in fleet:
        usable = x.gpus - x.allocated_gpus
        out[x.name] = usable - sum(1 for g in range(usable) if (x.name, g) in held)
    return out


def domain_free(fleet: Sequence[Node], shape: ShapeRequest, held: set[GpuKey], dom: str) -> int:
    """Free GPUs of the eligible nodes of one `together` domain (what headroom counts)."""
    free = free_gpus(fleet, held)
    return sum(
        free[x.name]
        for x in fleet
        if domain_of(x, shape.pair_level) == dom
        and any(eligible_for(x, shape, g) for g in shape.group_list)
    )


def check_valid(
    fleet: Sequence[Node], shape: ShapeRequest, held: set[GpuKey], res: Placement
) -> None:
    """Every engine whole, every group where its level says, every connect rule and the
    together level honoured, no GPU twice or held by another, the headroom kept."""
    by = {x.name: x for x in fleet}
    groups = shape.group_list
    assert [e.role for e in res.engines] == list(shape.roles)
    seen: set[GpuKey] = set()
    together: set[str] = set()
    for e in res.engines:
        assert [g.role for g in e.groups] == [g.role for g in groups]  # never a partial engine
        assert e.nodes == tuple(w for gp in e.groups for w in gp.workers)
        for want, gp in zip(groups, e.groups, strict=True):
            assert len(gp.nodes) == want.nodes == len(set(gp.nodes))
            assert len({domain_of(by[n], want.level) for n in gp.nodes}) == 1
            assert gp.domain == domain_of(by[gp.nodes[0]], want.level)
            for n, gpus in gp.workers:
                x = by[n]
                assert eligible_for(x, shape, want)
                assert len(gpus) == want.gpus_per_node == len(set(gpus))
                for g in gpus:
                    assert 0 <= g < x.gpus - x.allocated_gpus
                    assert (n, g) not in held and (n, g) not in seen  # no double booking
                    seen.add((n, g))
                together.add(domain_of(x, shape.pair_level))
        for rule in shape.connect:
            nodes = [n for gp in e.groups if gp.role in rule.groups for n in gp.nodes]
            assert len({domain_of(by[n], rule.level) for n in nodes}) == 1, rule
    assert len(together) == 1 and res.domain in together
    assert len(seen) == shape.gpus_per_gate
    left = domain_free(fleet, shape, held, res.domain) - shape.gpus_per_gate
    assert left >= shape.headroom_gpus


@st.composite
def fleets(draw: st.DrawFn, most: int = 6) -> list[Node]:
    out = []
    for i in range(draw(st.integers(2, most))):
        topo = {"block": f"b{draw(st.integers(0, 1))}"}
        if draw(st.integers(0, 4)):
            topo["clique"] = f"q{draw(st.integers(0, 2))}"
        h100 = draw(st.integers(0, 5)) == 0
        out.append(
            node(
                f"n{i}",
                gpus=draw(st.sampled_from([4, 8, 8])),
                sku="NVIDIA-H100" if h100 else "NVIDIA-H200",
                gpu_memory_gib=80 if h100 else 141,
                allocated_gpus=draw(st.integers(0, 2)),
                healthy=draw(st.integers(0, 9)) > 0,
                topology=topo,
            )
        )
    return out


def at_or_above(level: Level) -> list[Level]:
    return [lv for lv in LEVELS if LEVELS.index(lv) >= LEVELS.index(level)]


@st.composite
def group_shapes(draw: st.DrawFn, most: int = 3) -> ShapeRequest:
    groups = []
    for i in range(draw(st.integers(2, most))):
        nodes = draw(st.sampled_from([1, 1, 2]))
        gpn = draw(st.sampled_from([1, 2, 4]))
        if nodes == 1 and draw(st.booleans()):
            level: Level = "host"
        else:
            level = draw(st.sampled_from(["clique", "subblock", "block", "any"]))
        sku = draw(st.sampled_from([*[None] * 6, "H200", "H100"]))
        mem = draw(st.sampled_from([None, None, None, None, 100.0]))
        groups.append(GroupRequest(f"g{i}", gpn * nodes, nodes, level, sku, mem))
    rules = []
    for a, b in itertools.combinations(groups, 2):
        if draw(st.integers(0, 2)) == 0:
            low = max(a.level, b.level, key=LEVELS.index)
            rules.append(ConnectRule((a.role, b.role), draw(st.sampled_from(at_or_above(low)))))
    top = max([g.level for g in groups] + [r.level for r in rules], key=LEVELS.index)
    together = draw(st.sampled_from([None, *at_or_above(top)]))
    return ShapeRequest(
        groups=tuple(groups),
        connect=tuple(rules),
        together=together,
        roles=draw(st.sampled_from([ROLES, ("candidate",)])),
        headroom_gpus=draw(st.sampled_from([0, 0, 0, 2, 5])),
    )


HELD = st.tuples(st.integers(0, 2**30 - 1), st.sampled_from([0, 1, 2, 4]))


def held_from(fleet: list[Node], mask: tuple[int, int]) -> set[GpuKey]:
    """GPUs other reservations hold: none, or one in `every` of those a bit mask picks."""
    bits, every = mask
    keys = [(x.name, g) for x in fleet for g in range(x.gpus - x.allocated_gpus)]
    return {k for i, k in enumerate(keys) if every and i % every == 0 and bits >> (i % 30) & 1}
