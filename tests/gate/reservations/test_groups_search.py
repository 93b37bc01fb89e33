"""The search of gate/reservations/groups_search.py: pruning between gates changes no count,
and the candidates kept across searches (ranked domains, host classes) are a fresh look."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest.mock import patch

from group_fleets import (
    HELD,
    GpuKey,
    check_valid,
    fleets,
    group_shapes,
    held_from,
    node,
    pd_shape,
)
from hypothesis import given, settings

from gate.reservations import groups_search
from gate.reservations.allocator import (
    Placement,
    ShapeRequest,
    allocate,
    capacity,
)
from gate.reservations.inventory import Node


@settings(max_examples=100, deadline=None)
@given(fleet=fleets(most=8), shape=group_shapes(), mask=HELD)
def test_property_pruning_between_gates_changes_nothing(
    fleet: list[Node], shape: ShapeRequest, mask: tuple[int, int]
) -> None:
    """Large `together` domains drop the nodes a placed gate filled before counting the next
    gate; on these small ones (forced to prune) the count must not move."""
    held = held_from(fleet, mask)
    plain = capacity(fleet, shape, held)
    with patch.object(groups_search, "PRUNE_FROM", 0):
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
    assert len(fleet) > groups_search.PRUNE_FROM
    held: set[GpuKey] = set()
    expected = capacity(fleet, shape).gates
    granted = 0
    while isinstance(res := allocate(fleet, shape, held), Placement):
        check_valid(fleet, shape, held, res)
        held |= {k for _, k in res.gpu_keys()}
        granted += 1
    assert granted == expected > 10


@contextlib.contextmanager
def _caches_checked() -> Iterator[dict[str, int]]:
    """Every call of a step's kept candidates (ranked domains, host classes) compared with
    a fresh look at the same free counts; pruning forced, so every cache sees nodes leave."""
    ranked, hosts = groups_search.Search._ranked, groups_search.Search._hosts
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
        patch.object(groups_search.Search, "_ranked", checked_ranked),
        patch.object(groups_search.Search, "_hosts", checked_hosts),
        patch.object(groups_search, "PRUNE_FROM", 0),
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
        _fill(fleet, shape, held_from(fleet, mask), 8)


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
    c = groups_search.HostClasses([7, 3, 5])
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
