"""Whole engines of several worker groups: every group of both engines or none, the most
constrained group first, the alternatives a greedy order misses, and a blocked reason that
names the group and the layer."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.reservations import groups
from gate.reservations.allocator import (
    LEVELS,
    ROLES,
    STAGES,
    Blocked,
    ConnectRule,
    GroupRequest,
    Level,
    Placement,
    ShapeRequest,
    allocate,
    capacity,
    domain_of,
)
from gate.reservations.inventory import Node, load_inventory, normalise_sku
from gate.reservations.report import parse_shape

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


# -- what a valid placement is, checked from the inventory alone --------------------------------


def _eligible_for(x: Node, shape: ShapeRequest, g: GroupRequest) -> bool:
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


def _free(fleet: Sequence[Node], held: set[GpuKey]) -> dict[str, int]:
    out = {}
    for x in fleet:
        usable = x.gpus - x.allocated_gpus
        out[x.name] = usable - sum(1 for g in range(usable) if (x.name, g) in held)
    return out


def _domain_free(fleet: Sequence[Node], shape: ShapeRequest, held: set[GpuKey], dom: str) -> int:
    """Free GPUs of the eligible nodes of one `together` domain (what headroom counts)."""
    free = _free(fleet, held)
    return sum(
        free[x.name]
        for x in fleet
        if domain_of(x, shape.pair_level) == dom
        and any(_eligible_for(x, shape, g) for g in shape.group_list)
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
                assert _eligible_for(x, shape, want)
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
    left = _domain_free(fleet, shape, held, res.domain) - shape.gpus_per_gate
    assert left >= shape.headroom_gpus


def brute_force(fleet: Sequence[Node], shape: ShapeRequest, held: set[GpuKey]) -> bool:
    """Whether any placement exists: every node set of every instance, no heuristics."""
    groups = shape.group_list
    free = _free(fleet, held)
    elig = [[x for x in fleet if _eligible_for(x, shape, g)] for g in groups]
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
        left = _domain_free(fleet, shape, held, doms.pop()) - shape.gpus_per_gate
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
    free = _free(fleet, set())
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


def test_blocked_names_the_group_and_the_connect_layer() -> None:
    fleet = [
        node("q0a", topology={"clique": "q0"}),
        node("q0b", topology={"clique": "q0"}, allocated_gpus=8),
        node("q0c", topology={"clique": "q0"}, allocated_gpus=8),
        *(node(f"q1{c}", gpus=4, topology={"clique": "q1"}) for c in "abcd"),
    ]
    shape = pd_shape(
        prefill=(8, 1, "host"), decode=(8, 2, "clique"), together="any", roles=("candidate",)
    )
    res = allocate(fleet, shape)
    assert isinstance(res, Blocked), res
    assert res.code == "topology" and res.retryable  # q0b's GPUs may come back
    assert res.message == (
        "decode group needs 2 nodes in one clique with prefill; the largest clique with free "
        "prefill capacity has 1"
    )
    assert capacity(fleet, shape).gates == 0


def test_blocked_names_the_group_and_its_own_level() -> None:
    fleet = [node(f"n{i}", gpus=4, topology={"clique": f"q{i}"}) for i in range(6)]
    res = allocate(fleet, pd_shape(decode=(8, 2, "clique"), connect=None, together="any"))
    assert isinstance(res, Blocked) and res.code == "topology" and not res.retryable
    assert (
        "decode group needs 2 nodes with 4 free GPUs in one clique; the largest clique has 1"
        in (res.message)
    )


@pytest.mark.parametrize(
    ("fleet", "shape", "held", "code", "says"),
    [
        ([node("a", region="eu")], pd_shape(regions=("us",)), (), "region", "prefill group"),
        ([node("a")], pd_shape(decode=(8, 1, "host"), connect=None, sku="B200"), (), "sku", ""),
        (
            [node("a", sku="H100", gpu_memory_gib=80), node("b")],
            ShapeRequest(
                groups=(
                    GroupRequest("prefill", 4, 1, "host", "H100"),
                    GroupRequest("decode", 4, 1, "host", "B200"),
                )
            ),
            (),
            "sku",
            "decode group: no eligible node has GPU SKU B200",
        ),
        (
            [node("a", allocated_gpus=6)],
            pd_shape(decode=(4, 1, "host"), connect=None),
            (),
            "free_capacity",
            "for the prefill group",
        ),
        (
            [node("a"), node("b")],
            pd_shape(decode=(4, 1, "host"), connect=None, together="any", headroom_gpus=1),
            (),
            "transition_headroom",
            "",
        ),
        (
            [node("a"), node("b")],
            pd_shape(decode=(4, 1, "host"), connect=None, together="any"),
            [("a", g) for g in range(5)],
            "lease_conflict",
            "",
        ),
    ],
)
def test_blocked_codes_keep_their_layers(
    fleet: list[Node], shape: ShapeRequest, held: Any, code: str, says: str
) -> None:
    res = allocate(fleet, shape, held)
    assert isinstance(res, Blocked), res
    assert res.code == code and code in res.eliminated and says in res.message


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


def _at_or_above(level: Level) -> list[Level]:
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
            rules.append(ConnectRule((a.role, b.role), draw(st.sampled_from(_at_or_above(low)))))
    top = max([g.level for g in groups] + [r.level for r in rules], key=LEVELS.index)
    together = draw(st.sampled_from([None, *_at_or_above(top)]))
    return ShapeRequest(
        groups=tuple(groups),
        connect=tuple(rules),
        together=together,
        roles=draw(st.sampled_from([ROLES, ("candidate",)])),
        headroom_gpus=draw(st.sampled_from([0, 0, 0, 2, 5])),
    )


HELD = st.tuples(st.integers(0, 2**30 - 1), st.sampled_from([0, 1, 2, 4]))


def _held(fleet: list[Node], mask: tuple[int, int]) -> set[GpuKey]:
    """GPUs other reservations hold: none, or one in `every` of those a bit mask picks."""
    bits, every = mask
    keys = [(x.name, g) for x in fleet for g in range(x.gpus - x.allocated_gpus)]
    return {k for i, k in enumerate(keys) if every and i % every == 0 and bits >> (i % 30) & 1}


@settings(max_examples=300, deadline=None)
@given(fleet=fleets(most=8), shape=group_shapes(), mask=HELD)
def test_property_whole_valid_never_double_booked_and_counted_exactly(
    fleet: list[Node], shape: ShapeRequest, mask: tuple[int, int]
) -> None:
    """Allocating again and again: every placement valid and whole, none sharing a GPU with
    another or with what was held, and exactly as many as capacity() counted."""
    held = _held(fleet, mask)
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


@settings(max_examples=100, deadline=None)
@given(fleet=fleets(most=8), shape=group_shapes(), mask=HELD)
def test_property_pruning_between_gates_changes_nothing(
    fleet: list[Node], shape: ShapeRequest, mask: tuple[int, int]
) -> None:
    """Large `together` domains drop the nodes a placed gate filled before counting the next
    gate; on these small ones (forced to prune) the count must not move."""
    held = _held(fleet, mask)
    plain = capacity(fleet, shape, held)
    with patch.object(groups, "PRUNE_FROM", 0):
        assert capacity(fleet, shape, held) == plain


def test_a_large_domain_counts_what_allocation_grants() -> None:
    """300 nodes in one `together` domain: above the pruning threshold, still exact."""
    fleet = [
        node(
            f"n{i:03d}",
            allocated_gpus=(0, 0, 4, 2, 8)[i % 5],
            topology={"clique": f"q{i // 6}", "block": f"b{i // 60}"},
        )
        for i in range(300)
    ]
    shape = pd_shape(prefill=(8, 1, "host"), decode=(8, 2, "clique"), together="any")
    assert len(fleet) > groups.PRUNE_FROM
    held: set[GpuKey] = set()
    expected = capacity(fleet, shape).gates
    granted = 0
    while isinstance(res := allocate(fleet, shape, held), Placement):
        check_valid(fleet, shape, held, res)
        held |= {k for _, k in res.gpu_keys()}
        granted += 1
    assert granted == expected > 10


@settings(max_examples=400, deadline=None)
@given(fleet=fleets(most=4), shape=group_shapes(most=2), mask=HELD)
def test_property_the_allocator_finds_what_brute_force_finds(
    fleet: list[Node], shape: ShapeRequest, mask: tuple[int, int]
) -> None:
    held = _held(fleet, mask)
    res = allocate(fleet, shape, held)
    assert isinstance(res, Placement) == brute_force(fleet, shape, held), res
    assert (capacity(fleet, shape, held).gates >= 1) == isinstance(res, Placement)


# -- what the search keeps between calls -----------------------------------------------------------


@contextlib.contextmanager
def _caches_checked() -> Iterator[dict[str, int]]:
    """Every call of a step's kept candidates (ranked domains, host classes) compared with
    a fresh look at the same free counts; pruning forced, so every cache sees nodes leave."""
    ranked, hosts = groups._Search._ranked, groups._Search._hosts
    calls = {"ranked": 0, "hosts": 0}

    def checked_ranked(self: Any, step: Any, doms: Any, fixed: Any) -> Any:
        got = ranked(self, step, doms, fixed)
        key = (self.pair, step.layout, step.gpn, step.nodes, fixed)
        kept = self.f.ranked.pop(key)
        assert ranked(self, step, doms, fixed) == got
        self.f.ranked[key] = kept
        calls["ranked"] += 1
        return got

    def checked_hosts(self: Any, step: Any, doms: Any, fixed: Any) -> Any:
        got = hosts(self, step, doms, fixed)
        key = (self.pair, step.layout, step.gpn, fixed)
        kept = self.f.hosts.pop(key)
        assert hosts(self, step, doms, fixed) == got
        self.f.hosts[key] = kept
        calls["hosts"] += 1
        return got

    with (
        patch.object(groups._Search, "_ranked", checked_ranked),
        patch.object(groups._Search, "_hosts", checked_hosts),
        patch.object(groups, "PRUNE_FROM", 0),
    ):
        yield calls


def _fill(fleet: list[Node], shape: ShapeRequest, held: set[GpuKey], most: int) -> int:
    capacity(fleet, shape, held)
    for granted in range(most):
        res = allocate(fleet, shape, held)
        if not isinstance(res, Placement):
            return granted
        held |= {k for _, k in res.gpu_keys()}
    return most


@settings(max_examples=200, deadline=None)
@given(fleet=fleets(most=8), shape=group_shapes(), mask=HELD)
def test_property_candidates_kept_across_searches_are_a_fresh_look(
    fleet: list[Node], shape: ShapeRequest, mask: tuple[int, int]
) -> None:
    """A step's ranked domains and host classes are updated from the nodes changed since the
    last call, not rebuilt: at every call of a capacity count and of repeated allocations
    they equal what a fresh look gives."""
    with _caches_checked():
        _fill(fleet, shape, _held(fleet, mask), 8)


def test_kept_candidates_on_a_large_fragmented_domain_are_a_fresh_look() -> None:
    """The same on 300 fragmented nodes in one domain, where both caches are used hundreds
    of times (a prefill host per engine, decode pairs in cliques)."""
    fleet = [
        node(
            f"n{i:03d}",
            allocated_gpus=(0, 0, 4, 2, 8, 6)[i % 6],
            topology={"clique": f"q{i // 6}", "block": f"b{i // 60}"},
        )
        for i in range(300)
    ]
    shape = pd_shape(prefill=(2, 1, "host"), decode=(4, 2, "clique"), together="any")
    with _caches_checked() as calls:
        assert _fill(fleet, shape, set(), 40) == 40
    assert calls["ranked"] > 100 and calls["hosts"] > 100, calls


def test_the_host_classes_follow_nodes_as_they_fill_and_empty() -> None:
    """_Classes on its own: a class is tried through its first member in the candidates'
    order; moving nodes between classes (a gate placed, then taken back) keeps that."""
    c = groups._Classes([7, 3, 5])
    for x, cls in ((7, (8, 0)), (3, (8, 0)), (5, (4, 0))):
        c.move(x, cls)
    assert c.ranked == [(4, 5), (8, 7)]
    c.move(7, (4, 0))  # node 7 filled by 4 GPUs: it leads the 4-GPU class, 3 leads the 8s
    assert c.ranked == [(4, 7), (8, 3)]
    c.move(3, None)  # node 3 full
    assert c.ranked == [(4, 7)]
    c.move(7, (8, 0))  # taken back: 7 (first in order) leads the 8s again, 5 the 4s
    assert c.ranked == [(4, 5), (8, 7)]
    c.move(3, (8, 0))
    assert c.ranked == [(4, 5), (8, 7)] and c.members[(8, 0)] == [0, 1]


@settings(max_examples=200, deadline=None)
@given(fleet=fleets(most=8), shape=group_shapes())
def test_property_a_scan_projected_to_some_groups_is_their_own_scan(
    fleet: list[Node], shape: ShapeRequest
) -> None:
    """A blocked answer relaxes the shape group by group on the whole shape's scan: the
    projection has the nodes, masks, keys and domains a scan of the smaller shape reads."""
    whole = groups.scan(fleet, shape)
    roles = [g.role for g in shape.group_list]
    for k in range(1, len(roles) + 1):
        for keep in itertools.combinations(roles, k):
            for rules in (groups._restricted(shape, keep), []):
                sub = groups._sub_shape(shape, keep, rules)
                got, want = groups._project(whole, sub), groups.scan(fleet, sub)
                assert [x.name for x in got.nodes] == [x.name for x in want.nodes]
                assert (got.masks, got.keys, got.levels) == (want.masks, want.keys, want.levels)
                assert got.pairs == want.pairs
                assert (got.gpus, got.unallocated) == (want.gpus, want.unallocated)
