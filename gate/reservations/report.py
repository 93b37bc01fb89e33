"""Capacity as a document (JSON) and as a table, shared by `gate capacity` and the API.

Gates are whole: for a shape of several worker groups, a gate counts only when every group of
both engines fits (`groups` then says how each group alone would fare, the rarest first)."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from gate.reservations.allocator import (
    LEVELS,
    Blocked,
    Capacity,
    ConnectRule,
    GroupRequest,
    Level,
    ShapeRequest,
    allocate,
    capacity,
)
from gate.reservations.inventory import Inventory

SHAPE_KEYS = {
    "sku": str,
    "min_gpu_memory_gib": float,
    "gpus_per_engine": int,
    "nodes_per_engine": int,
    "engine_level": str,
    "together": str,
    "regions": tuple,
    "providers": tuple,
    "pools": tuple,
    "headroom_gpus": int,
    "groups": GroupRequest,
    "connect": ConnectRule,
}
GROUP_TEXT = re.compile(r"^(?P<role>[^:]+):(?P<gpus>\d+)(?:x(?P<nodes>\d+))?(?:@(?P<level>\w+))?$")
CONNECT_TEXT = re.compile(r"^(?P<groups>[^@]+)@(?P<level>\w+)$")


def _level(value: str, key: str) -> Level:
    for level in LEVELS:
        if level == value:
            return level
    raise ValueError(f"--shape: {key}: level {value!r} is not one of {', '.join(LEVELS)}")


def _group(text: str) -> GroupRequest:
    """`decode:16x2@clique`: role, GPUs, x nodes (default 1), @ level (default host)."""
    m = GROUP_TEXT.match(text)
    if not m:
        raise ValueError(f"--shape: groups: {text!r} is not ROLE:GPUS[xNODES][@LEVEL]")
    level = _level(m["level"] or "host", "groups")
    return GroupRequest(m["role"], int(m["gpus"]), int(m["nodes"] or 1), level)


def _connect(text: str) -> ConnectRule:
    """`prefill/decode@clique`: the groups, / between them, @ the level."""
    m = CONNECT_TEXT.match(text)
    if not m:
        raise ValueError(f"--shape: connect: {text!r} is not ROLE/ROLE[/...]@LEVEL")
    return ConnectRule(tuple(m["groups"].split("/")), _level(m["level"], "connect"))


def parse_shape(text: str) -> dict[str, Any]:
    """`sku=H200,gpus_per_engine=8,regions=us-east1+us-west1` -> keyword arguments. Several
    groups: `groups=prefill:4+decode:8x2@clique,connect=prefill/decode@clique`."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"--shape: {part!r} is not key=value")
        key, value = (s.strip() for s in part.split("=", 1))
        kind = SHAPE_KEYS.get(key)
        if kind is None:
            raise ValueError(f"--shape: unknown key {key!r}; use one of {', '.join(SHAPE_KEYS)}")
        if kind is GroupRequest:
            out[key] = tuple(_group(v) for v in value.split("+"))
            continue
        if kind is ConnectRule:
            out[key] = tuple(_connect(v) for v in value.split("+"))
            continue
        try:
            out[key] = tuple(value.split("+")) if kind is tuple else kind(value)
        except ValueError:
            raise ValueError(f"--shape: {key} must be {kind.__name__}, got {value!r}") from None
    return out


def capacity_document(
    inventory: Inventory, shape: ShapeRequest, held: list[tuple[str, int]], elapsed_ms: float
) -> dict[str, Any]:
    cap: Capacity = capacity(inventory.nodes, shape, held)
    blocked = None
    if cap.gates == 0:
        res = allocate(inventory.nodes, shape, held)
        if isinstance(res, Blocked):
            blocked = {
                "code": res.code,
                "message": res.message,
                "retryable": res.retryable,
                "eliminated": res.eliminated,
            }
    shape_doc = asdict(shape)
    shape_doc.pop("roles", None)
    if shape.groups:  # each group gives its own size and level
        for key in ("gpus_per_engine", "nodes_per_engine", "engine_level"):
            shape_doc.pop(key, None)
        shape_doc["groups"] = [asdict(g) for g in shape.group_list]
    else:
        shape_doc.pop("groups", None)
        shape_doc.pop("connect", None)
    return {
        "inventory": inventory.name,
        "shape": shape_doc,
        "level": cap.level,
        "gates": cap.gates,
        "engines": cap.engines,
        "free_gpus": cap.free_gpus,
        "eligible_nodes": cap.eligible_nodes,
        "nodes": len(inventory.nodes),
        "gpus": sum(n.gpus for n in inventory.nodes),
        "held_by_gates": len(held),
        "per_domain": [f._asdict() for f in cap.per_domain],
        # Several groups: each alone, most constrained (the placement order) first.
        "groups": [g._asdict() for g in cap.groups],
        "blocked": blocked,
        "elapsed_ms": round(elapsed_ms, 3),
    }
