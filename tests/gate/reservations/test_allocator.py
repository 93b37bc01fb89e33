from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.reservations.allocator import (
    LEVELS,
    Blocked,
    Placement,
    ShapeRequest,
    allocate,
    capacity,
    domain_of,
)
from gate.reservations.inventory import Node, load_inventory, normalise_sku


def node(name: str, gpus: int = 8, sku: str = "NVIDIA-H200", **kw: Any) -> Node:
    return Node(name=name, sku=sku, gpu_memory_gib=141, gpus=gpus, **kw)


def nvl72(rack: str, hosts: int = 18) -> list[Node]:
    return [
        node(
            f"{rack}-h{i}",
            gpus=4,
            sku="NVIDIA-GB200",
            cluster="c",
            topology={"clique": f"{rack}.0", "block": "b0"},
        )
        for i in range(hosts)
    ]


def test_normalise_sku() -> None:
    for raw in ("NVIDIA-H200", "nvidia h200", "H200", "NVIDIA-H200-SXM", "Tesla-H200"):
        assert normalise_sku(raw) == "H200"
    assert normalise_sku("NVIDIA-GB200") == "GB200"


def test_embedded_inventory_loads() -> None:
    inv = load_inventory()
    assert inv.name == "local" and inv.nodes[0].gpus == 8


def test_two_engines_get_disjoint_gpus_on_one_node() -> None:
    res = allocate([node("a")], ShapeRequest(sku="H200", gpus_per_engine=2))
    assert isinstance(res, Placement)
    ref, cand = res.for_role("reference"), res.for_role("candidate")
    assert ref.node == cand.node == "a"
    assert set(ref.gpus).isdisjoint(cand.gpus) and len(ref.gpus) == 2 == len(cand.gpus)
    assert ref.cuda_visible_devices == "0,1" and cand.cuda_visible_devices == "2,3"


def test_best_fit_prefers_the_tightest_domain() -> None:
    res = allocate([node("big", gpus=8), node("small", gpus=4)], ShapeRequest(gpus_per_engine=2))
    assert isinstance(res, Placement) and res.domain == "small"
    held = [("big", g) for g in range(4)]
    res = allocate([node("big"), node("other")], ShapeRequest(gpus_per_engine=2), held)
    assert isinstance(res, Placement) and res.domain == "big"
    assert res.engines[0].gpus == (4, 5) and res.engines[1].gpus == (6, 7)


def test_gb200_clique_multi_node_engines() -> None:
    """NVL72: 18 hosts x 4 GPUs in one clique; engines of 16 GPUs on 4 hosts each."""
    fleet = nvl72("r0") + nvl72("r1")
    shape = ShapeRequest(sku="GB200", gpus_per_engine=16, nodes_per_engine=4, engine_level="clique")
    cap = capacity(fleet, shape)
    assert cap.engines == 8 and cap.gates == 4  # floor(18/4) = 4 engines per rack, 2 gates
    assert {f.domain for f in cap.per_domain} == {"c/clique=r0.0", "c/clique=r1.0"}
    res = allocate(fleet, shape)
    assert isinstance(res, Placement)
    for e in res.engines:
        assert len(e.nodes) == 4 and len({n for n, _ in e.nodes}) == 4
        assert all(len(g) == 4 for _, g in e.nodes)
    assert (
        len(
            {
                domain_of(x, "clique")
                for x in fleet
                if x.name in {n for e in res.engines for n, _ in e.nodes}
            }
        )
        == 1
    )


def test_capacity_counts_shapes_not_gpus() -> None:
    """100 idle GPUs can fit no 8-GPU connected shape when they are scattered."""
    fleet = [node(f"n{i}", gpus=8, allocated_gpus=4) for i in range(25)]
    shape = ShapeRequest(gpus_per_engine=8)
    cap = capacity(fleet, shape)
    assert cap.free_gpus == 100 and cap.gates == 0
    res = allocate(fleet, shape)
    assert isinstance(res, Blocked)
    assert res.code == "topology" and not res.retryable  # no host can ever hold 16 GPUs
    shape4 = ShapeRequest(gpus_per_engine=4, together="block")
    res = allocate(fleet, shape4)
    assert isinstance(res, Blocked) and res.code == "topology" and res.retryable


@pytest.mark.parametrize(
    ("fleet", "shape", "held", "code", "retryable"),
    [
        ([node("a", region="eu")], ShapeRequest(regions=("us",)), (), "region", False),
        ([node("a", provider="gcp")], ShapeRequest(providers=("aws",)), (), "provider", False),
        ([node("a", pool="prod")], ShapeRequest(pools=("gate",)), (), "policy", False),
        ([node("a")], ShapeRequest(sku="B200"), (), "sku", False),
        ([node("a")], ShapeRequest(min_gpu_memory_gib=200), (), "gpu_memory", False),
        ([node("a", cordoned=True), node("b", healthy=False)], ShapeRequest(), (), "health", True),
        ([node("a", taints=["gpu=broken:NoSchedule"])], ShapeRequest(), (), "health", True),
        ([node("a", allocated_gpus=7)], ShapeRequest(), (), "free_capacity", True),
        ([node("a", gpus=4)], ShapeRequest(gpus_per_engine=4), (), "free_capacity", False),
        (
            [node("a", gpus=4), node("b", gpus=4)],
            ShapeRequest(gpus_per_engine=4),
            (),
            "topology",
            False,
        ),
        (
            [node("a", allocated_gpus=5), node("b", allocated_gpus=5)],
            ShapeRequest(gpus_per_engine=2),
            (),
            "topology",
            True,
        ),
        (
            [node("a")],
            ShapeRequest(gpus_per_engine=2, headroom_gpus=5),
            (),
            "transition_headroom",
            True,
        ),
        ([node("a")], ShapeRequest(), [("a", g) for g in range(7)], "lease_conflict", True),
    ],
)
def test_blocked_code_for_each_stage(
    fleet: list[Node], shape: ShapeRequest, held: Any, code: str, retryable: bool
) -> None:
    res = allocate(fleet, shape, held)
    assert isinstance(res, Blocked), res
    assert res.code == code and res.retryable is retryable
    assert res.message
    assert code in res.eliminated
    if code in ("region", "provider", "policy", "sku", "gpu_memory", "health"):
        assert res.eliminated[code] >= 1


def test_blocked_reports_per_domain_fit() -> None:
    fleet = [node("a"), node("b")]
    held = [("a", g) for g in range(7)] + [("b", g) for g in range(7)]
    res = allocate(fleet, ShapeRequest(), held)
    assert isinstance(res, Blocked) and res.code == "lease_conflict"
    assert {f.domain: f.free_gpus for f in res.per_domain} == {"a": 1, "b": 1}


def test_shape_validation() -> None:
    with pytest.raises(ValueError, match="multiple"):
        ShapeRequest(gpus_per_engine=6, nodes_per_engine=4)
    with pytest.raises(ValueError, match="at or above"):
        ShapeRequest(engine_level="block", together="host")


LEVEL_STRATEGY = st.sampled_from(["host", "clique", "block", "any"])


@st.composite
def fleets(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 7))
    out = []
    for i in range(count):
        out.append(
            node(
                f"n{i}",
                gpus=draw(st.sampled_from([2, 4, 8])),
                allocated_gpus=draw(st.integers(0, 2)),
                topology={
                    "clique": f"q{draw(st.integers(0, 2))}",
                    "block": f"b{draw(st.integers(0, 1))}",
                },
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(
    fleet=fleets(),
    gpe=st.sampled_from([1, 2, 4, 8]),
    npe=st.sampled_from([1, 2]),
    engine_level=LEVEL_STRATEGY,
    together_up=st.integers(0, 3),
    headroom=st.integers(0, 6),
    held_mask=st.integers(0, 2**30 - 1),
)
def test_property_capacity_is_exactly_what_allocation_delivers(
    fleet: list[Node],
    gpe: int,
    npe: int,
    engine_level: str,
    together_up: int,
    headroom: int,
    held_mask: int,
) -> None:
    """Allocating again and again succeeds exactly `capacity` times, never double-books, and
    every placement respects its domains and distinct nodes."""
    if npe > 1 and engine_level == "host":
        engine_level = "clique"
    if gpe % npe:
        gpe = npe
    idx = LEVELS.index(engine_level)  # type: ignore[arg-type]
    together = LEVELS[min(idx + together_up, len(LEVELS) - 1)]
    shape = ShapeRequest(
        gpus_per_engine=gpe,
        nodes_per_engine=npe,
        engine_level=engine_level,  # type: ignore[arg-type]
        together=together,
        headroom_gpus=headroom,
    )
    keys = [(x.name, g) for x in fleet for g in range(x.gpus - x.allocated_gpus)]
    held = {k for i, k in enumerate(keys) if held_mask >> (i % 30) & 1}
    expected = capacity(fleet, shape, held).gates
    granted = 0
    while True:
        res = allocate(fleet, shape, held)
        if isinstance(res, Blocked):
            break
        got = [k for _, k in res.gpu_keys()]
        assert len(got) == len(set(got)) == shape.gpus_per_gate
        assert not set(got) & held
        by_name = {x.name: x for x in fleet}
        for _, (n, g) in res.gpu_keys():
            assert g < by_name[n].gpus - by_name[n].allocated_gpus
        for e in res.engines:
            assert len({n for n, _ in e.nodes}) == npe
            assert len({domain_of(by_name[n], shape.engine_level) for n, _ in e.nodes}) == 1
        pair = {domain_of(by_name[n], shape.pair_level) for e in res.engines for n, _ in e.nodes}
        assert len(pair) == 1
        held |= set(got)
        granted += 1
        assert granted <= 64
    assert granted == expected
    assert capacity(fleet, shape, held).gates == 0


def test_exhaustive_small_fleet() -> None:
    """Every held subset of a 2x4-GPU fleet: a placement exists iff a host has 2 free GPUs."""
    fleet = [node("a", gpus=4), node("b", gpus=4)]
    keys = [(x.name, g) for x in fleet for g in range(4)]
    for r in range(len(keys) + 1):
        for held in itertools.combinations(keys, r):
            res = allocate(fleet, ShapeRequest(), held)
            feasible = any(sum(1 for k in keys if k[0] == n and k not in held) >= 2 for n in "ab")
            assert isinstance(res, Placement) == feasible
            assert capacity(fleet, ShapeRequest(), held).gates == sum(
                sum(1 for k in keys if k[0] == n and k not in held) // 2 for n in "ab"
            )
