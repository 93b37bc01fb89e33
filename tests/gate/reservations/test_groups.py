"""Whole engines of several worker groups: every group of both engines or none, the most
constrained group first, the alternatives a greedy order misses, counted exactly (the blocked
reasons are in test_groups_blocked.py, the search's caches in test_groups_search.py)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from group_fleets import (
    HELD,
    GpuKey,
    check_valid,
    domain_free,
    eligible_for,
    fleets,
    free_gpus,
    group_shapes,
    held_from,
    node,
    pd_shape,
)
from hypothesis import given, settings

from gate.reservations.allocator import (
    ROLES,
    STAGES,
    Blocked,
    ConnectRule,
    GroupRequest,
    Placement,
    ShapeRequest,
    allocate,
    capacity,
    domain_of,
)
from gate.reservations.inventory import Node, load_inventory
from gate.reservations.report import parse_shape

# -- what a valid placement is, checked from the inventory alone --------------------------------


def brute_force(fleet: Sequence[Node], shape: ShapeRequest, held: set[GpuKey]) -> bool:
    """Whether any placement exists: every node set of every instance, no heuristics."""
    groups = shape.group_list
    free = free_gpus(fleet, held)
    elig = [[x for x in fleet if eligible_for(x, shape, g)] for g in groups]
    instances = [(gi, r) for r in range(len(shape.roles)) for gi in range(len(groups))]
    used: dict[str, int] = dict.fromkeys(free, 0)
    chosen: dict[tuple[int, int], tuple[Node, ...]] = {}

    def done() -> bool:
        doms = {domain_of(x, shape.pair_level) for c in chosen.values() for x in c}
        if len(doms) != 1:
            return False
        for r in range(len(shape.roles)):
            for rule in shape.connect:
                idx = [i for i, g in enumerate(groups) if g.role in rule.groups]
                if len({domain_of(x, rule.level) for i in idx for x in chosen[(i, r)]}) != 1:
                    return False
        left = domain_free(fleet, shape, held, doms.pop()) - shape.gpus_per_gate
        return left >= shape.headroom_gpus

    def rec(k: int) -> bool:
        if k == len(instances):
            return done()
        gi, r = instances[k]
        g = groups[gi]
        for combo in itertools.combinations(elig[gi], g.nodes):
            if any(free[x.name] - used[x.name] < g.gpus_per_node for x in combo):
                continue
            if len({domain_of(x, g.level) for x in combo}) != 1:
                continue
            for x in combo:
                used[x.name] += g.gpus_per_node
            chosen[(gi, r)] = combo
            if rec(k + 1):
                return True
            for x in combo:
                used[x.name] -= g.gpus_per_node
        return False

    return rec(0)


def naive_in_written_order(fleet: Sequence[Node], shape: ShapeRequest) -> bool:
    """What a scheduler placing group after group as written does: each engine's groups in
    order, each on the tightest nodes that fit, never revisiting a choice."""
    free = free_gpus(fleet, set())
    for _ in shape.roles:
        for g in shape.group_list:
            fits = sorted(
                (x for x in fleet if free[x.name] >= g.gpus_per_node),
                key=lambda x: (free[x.name], x.name),
            )
            by_dom: dict[str, list[Node]] = {}
            for x in fits:
                by_dom.setdefault(domain_of(x, g.level), []).append(x)
            room = [xs for xs in by_dom.values() if len(xs) >= g.nodes]
            if not room:
                return False
            for x in room[0][: g.nodes]:
                free[x.name] -= g.gpus_per_node
    return True


# -- the seed's trap, and what a greedy order misses ---------------------------------------------


def test_the_flexible_group_first_strands_the_rigid_one_the_rarest_first_fits() -> None:
    """Decode needs two nodes of the one clique, for both engines; prefill goes on any host.
    Placed as written (prefill first, ties by name), prefill takes a clique node and the
    second decode has nowhere to go. The rarest first (decode) fits every group."""
    fleet = [
        node("a0", topology={"clique": "q0"}),
        node("a1", topology={"clique": "q0"}),
        node("z0"),
        node("z1"),
    ]
    shape = pd_shape(decode=(8, 2, "clique"), connect=None, together="any")
    assert not naive_in_written_order(fleet, shape)
    cap = capacity(fleet, shape)
    assert [g.role for g in cap.groups] == ["decode", "prefill"]  # the placement order
    assert cap.groups[0].domains == 1 and cap.groups[1].domains == 4
    res = allocate(fleet, shape)
    assert isinstance(res, Placement), res
    check_valid(fleet, shape, set(), res)
    for role in ROLES:
        assert set(res.for_group(role, "decode").nodes) == {"a0", "a1"}
        assert res.for_group(role, "prefill").nodes[0] in {"z0", "z1"}
    assert cap.gates == 1


def test_backtracking_finds_what_the_rarest_first_greedy_misses() -> None:
    """Both decodes fit tightest in clique q0, which then has no room for a prefill connected
    to either: the search goes back and puts one decode in q1."""
    q0 = [node(f"q0{c}", topology={"clique": "q0", "block": "b"}) for c in "ab"]
    q1 = [node(f"q1{c}", topology={"clique": "q1", "block": "b"}) for c in "abc"]
    shape = pd_shape(decode=(8, 2, "clique"), connect="clique", together="block")
    res = allocate(q0 + q1, shape)
    assert isinstance(res, Placement), res
    check_valid(q0 + q1, shape, set(), res)
    cliques = {res.for_group(r, "decode").domain for r in ROLES}
    assert cliques == {"local/clique=q0", "local/clique=q1"}
    assert capacity(q0 + q1, shape).gates == 1


# -- the hand-off to the launcher ------------------------------------------------------------------


def test_placement_hands_on_each_groups_nodes_and_gpus() -> None:
    inv = load_inventory("examples/inventory/gb200-nvl72.yaml")
    shape = pd_shape(sku="GB200")
    res = allocate(inv.nodes, shape)
    assert isinstance(res, Placement)
    check_valid(inv.nodes, shape, set(), res)
    dec = res.for_group("candidate", "decode")
    assert len(dec.nodes) == 2 and dec.gpus == ((0, 1, 2, 3), (0, 1, 2, 3))
    assert dec.workers == tuple(zip(dec.nodes, dec.gpus, strict=True))
    assert dec.visible_devices(dec.nodes[1]) == "0,1,2,3" == dec.cuda_visible_devices
    assert dec.domain.startswith("dfw-1/clique=") and dec.sku == "GB200"
    pre = res.for_role("reference").group("prefill")
    assert pre.gpus_per_node == 4 and pre.domain == pre.nodes[0]
    cap = capacity(inv.nodes, shape)
    assert cap.gates == 5 and [d.gates for d in cap.per_domain] == [3, 2]


def test_a_single_group_written_as_groups_is_the_classic_shape() -> None:
    inv = load_inventory("examples/inventory/gb200-nvl72.yaml")
    classic = ShapeRequest(
        sku="GB200", gpus_per_engine=16, nodes_per_engine=4, engine_level="clique"
    )
    one = ShapeRequest(sku="GB200", groups=(GroupRequest("decode", 16, 4, "clique"),))
    assert capacity(inv.nodes, one).gates == capacity(inv.nodes, classic).gates == 3
    a, b = allocate(inv.nodes, classic), allocate(inv.nodes, one)
    assert isinstance(a, Placement) and isinstance(b, Placement)
    assert [e.nodes for e in a.engines] == [e.nodes for e in b.engines]
    assert [g.role for e in a.engines for g in e.groups] == ["engine", "engine"]
    assert [g.role for e in b.engines for g in e.groups] == ["decode", "decode"]


def test_prefill_and_decode_may_share_a_node_on_disjoint_gpus() -> None:
    shape = pd_shape(decode=(4, 1, "host"), connect="host", together="host")
    res = allocate([node("a")], shape, [])
    assert isinstance(res, Blocked)  # 16 GPUs for two engines on one 8-GPU host
    res = allocate([node("a", gpus=16)], shape)
    assert isinstance(res, Placement)
    check_valid([node("a", gpus=16)], shape, set(), res)
    assert {g for _, (_, g) in res.gpu_keys()} == set(range(16))


def test_shape_request_names_the_field_it_refuses() -> None:
    g = GroupRequest
    with pytest.raises(ValueError, match=r"groups\[1\].gpus: 12 GPUs must be a multiple"):
        ShapeRequest(groups=(g("prefill", 4), g("decode", 12, 8, "clique")))
    with pytest.raises(ValueError, match=r"groups\[1\].role: duplicate role"):
        ShapeRequest(groups=(g("decode", 4), g("decode", 4)))
    with pytest.raises(ValueError, match=r"connect\[0\].groups: unknown group 'x'"):
        ShapeRequest(groups=(g("a", 4), g("b", 4)), connect=(ConnectRule(("a", "x"), "host"),))
    with pytest.raises(ValueError, match=r"connect\[0\].level: host is below group b"):
        ShapeRequest(
            groups=(g("a", 4), g("b", 8, 2, "clique")), connect=(ConnectRule(("a", "b"), "host"),)
        )
    with pytest.raises(ValueError, match=r"groups\[0\].role: must be 1-16 lower-case"):
        ShapeRequest(groups=(g("Pre_fill", 4), g("b", 4)))
    with pytest.raises(ValueError, match="at most 8 groups"):
        ShapeRequest(groups=tuple(g(f"g{i}", 1) for i in range(9)))


def test_parse_shape_reads_groups_and_connect() -> None:
    kw = parse_shape("sku=GB200,groups=prefill:4+decode:8x2@clique,connect=prefill/decode@clique")
    assert ShapeRequest(**kw) == pd_shape(sku="GB200")
    with pytest.raises(ValueError, match="ROLE:GPUS"):
        parse_shape("groups=prefill")
    with pytest.raises(ValueError, match="level 'rack'"):
        parse_shape("groups=decode:8x2@rack")


# -- properties over random inventories ----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(fleet=fleets(most=8), shape=group_shapes(), mask=HELD)
def test_property_whole_valid_never_double_booked_and_counted_exactly(
    fleet: list[Node], shape: ShapeRequest, mask: tuple[int, int]
) -> None:
    """Allocating again and again: every placement valid and whole, none sharing a GPU with
    another or with what was held, and exactly as many as capacity() counted."""
    held = held_from(fleet, mask)
    expected = capacity(fleet, shape, held).gates
    granted = 0
    while True:
        res = allocate(fleet, shape, held)
        if isinstance(res, Blocked):
            assert res.code in STAGES and res.message
            break
        check_valid(fleet, shape, held, res)
        held |= {k for _, k in res.gpu_keys()}
        granted += 1
        assert granted <= 64
    assert granted == expected
    assert capacity(fleet, shape, held).gates == 0


@settings(max_examples=400, deadline=None)
@given(fleet=fleets(most=4), shape=group_shapes(most=2), mask=HELD)
def test_property_the_allocator_finds_what_brute_force_finds(
    fleet: list[Node], shape: ShapeRequest, mask: tuple[int, int]
) -> None:
    held = held_from(fleet, mask)
    res = allocate(fleet, shape, held)
    assert isinstance(res, Placement) == brute_force(fleet, shape, held), res
    assert (capacity(fleet, shape, held).gates >= 1) == isinstance(res, Placement)
