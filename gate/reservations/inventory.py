"""GPU inventory: nodes with their SKU, memory, GPU count, topology, health.

The embedded default reads a YAML file (`examples/inventory/local.yaml`); a later source reads a
live Kubernetes cluster. Both produce the same `Node` values for the pure allocator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import gate
from gate.core.errors import FieldProblem, SpecError

_SKU_RE = re.compile(r"(?:NVIDIA[-_ ]?)?(?:TESLA[-_ ]?)?([A-Z]+\d+[A-Z]*)", re.IGNORECASE)


@lru_cache(maxsize=4096)
def normalise_sku(raw: str) -> str:
    """`NVIDIA-H200`, `nvidia h200 141gb`, `H200-SXM` -> `H200`."""
    m = _SKU_RE.search(raw.strip())
    return m.group(1).upper() if m else raw.strip().upper()


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    cluster: str = "local"
    region: str = "local"
    provider: str = "local"
    pool: str = "default"
    sku: str
    gpu_memory_gib: float = Field(gt=0)
    gpus: int = Field(ge=1, le=1024)
    allocated_gpus: int = Field(default=0, ge=0, description="GPUs used by other workloads")
    topology: dict[str, str] = Field(default_factory=dict)
    healthy: bool = True
    cordoned: bool = False
    taints: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _allocated_fits(self) -> Node:
        if self.allocated_gpus > self.gpus:
            raise ValueError(f"allocated_gpus ({self.allocated_gpus}) exceeds gpus ({self.gpus})")
        return self

    @property
    def normalised_sku(self) -> str:
        return normalise_sku(self.sku)


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    nodes: list[Node] = Field(min_length=1)


def default_inventory_path() -> Path:
    root = Path(gate.__file__).resolve().parent
    for candidate in (
        root / "_examples" / "inventory" / "local.yaml",
        root.parent / "examples" / "inventory" / "local.yaml",
    ):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("the embedded example inventory examples/inventory/local.yaml")


def parse_inventory(data: Any, source: str) -> Inventory:
    if not isinstance(data, Mapping):
        raise SpecError([FieldProblem("(inventory)", "must be a mapping")], source)
    try:
        return Inventory.model_validate(dict(data))
    except ValidationError as exc:
        problems = [
            FieldProblem(".".join(str(p) for p in e["loc"]) or "(inventory)", str(e["msg"]))
            for e in exc.errors()
        ]
        raise SpecError(problems, source) from None


def load_inventory(path: str | Path | None = None) -> Inventory:
    p = Path(path) if path else default_inventory_path()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError([FieldProblem("inventory", f"cannot read {p}: {exc.strerror}")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([FieldProblem("inventory", f"invalid YAML in {p}: {exc}")]) from None
    return parse_inventory(data, str(p))
