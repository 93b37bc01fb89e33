"""The scan of gate/reservations/groups_fleet.py: a projection to fewer groups is their own scan."""

from __future__ import annotations

import itertools

from group_fleets import (
    fleets,
    group_shapes,
)
from hypothesis import given, settings

from gate.reservations import groups_blocked, groups_fleet
from gate.reservations.allocator import (
    ShapeRequest,
)
from gate.reservations.inventory import Node


@settings(max_examples=200, deadline=None)
@given(fleet=fleets(most=8), shape=group_shapes())
def test_property_a_scan_projected_to_some_groups_is_their_own_scan(
    fleet: list[Node], shape: ShapeRequest
) -> None:
    """A blocked answer relaxes the shape group by group on the whole shape's scan: the
    projection has the nodes, masks, keys and domains a scan of the smaller shape reads."""
    whole = groups_fleet.scan(fleet, shape)
    roles = [g.role for g in shape.group_list]
    for k in range(1, len(roles) + 1):
        for keep in itertools.combinations(roles, k):
            for rules in (groups_blocked._restricted(shape, keep), []):
                sub = groups_blocked._sub_shape(shape, keep, rules)
                got, want = groups_fleet.project(whole, sub), groups_fleet.scan(fleet, sub)
                assert [x.name for x in got.nodes] == [x.name for x in want.nodes]
                assert (got.masks, got.keys, got.levels) == (want.masks, want.keys, want.levels)
                assert got.pairs == want.pairs
                assert (got.gpus, got.unallocated) == (want.gpus, want.unallocated)
