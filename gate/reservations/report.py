"""Capacity as a document (JSON) and as a table, shared by `gate capacity` and the API."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from gate.reservations.allocator import Blocked, Capacity, ShapeRequest, allocate, capacity
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
}


def parse_shape(text: str) -> dict[str, Any]:
    """`sku=H200,gpus_per_engine=8,regions=us-east1+us-west1` -> keyword arguments."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"--shape: {part!r} is not key=value")
        key, value = (s.strip() for s in part.split("=", 1))
        kind = SHAPE_KEYS.get(key)
        if kind is None:
            raise ValueError(f"--shape: unknown key {key!r}; use one of {', '.join(SHAPE_KEYS)}")
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
        "blocked": blocked,
        "elapsed_ms": round(elapsed_ms, 3),
    }
