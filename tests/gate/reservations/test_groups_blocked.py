"""Why not (gate/reservations/groups_blocked.py): a blocked answer names the group and the
layer, and keeps each stage's code."""

from __future__ import annotations

from typing import Any

import pytest
from group_fleets import (
    node,
    pd_shape,
)

from gate.reservations.allocator import (
    Blocked,
    GroupRequest,
    ShapeRequest,
    allocate,
    capacity,
)
from gate.reservations.inventory import Node


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
