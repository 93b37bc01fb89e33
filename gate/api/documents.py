"""The shapes of the operations answers (capacity, inventory), for the OpenAPI document.

They are built by the reservation report as plain JSON; these models describe them for clients
and `/v1/openapi.json`. Fields the services may add later are allowed (`extra="allow"`), and
the API tests validate real answers against these models, so the description cannot drift
from what is served. The verdict document and a re-judged verdict are typed where they are
made (gate/verdict), and the API serves those models themselves.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class CapacityDoc(_Open):
    inventory: str
    shape: dict[str, Any]
    level: str | None = Field(description="the domain level gates are counted per")
    gates: int = Field(description="how many gates of this shape fit now")
    engines: int
    free_gpus: int
    eligible_nodes: int
    nodes: int
    gpus: int
    held_by_gates: int
    per_domain: list[dict[str, Any]]
    groups: list[dict[str, Any]] = Field(
        default_factory=list,
        description="a shape of several worker groups: each group alone (eligible nodes, free "
        "GPUs, domains, instances that fit), most constrained first, the order they are placed "
        "in; `gates` counts only whole gates",
    )
    blocked: dict[str, Any] | None = Field(description="why none fits, layer by layer")
    elapsed_ms: float


class InventoryDoc(_Open):
    name: str
    nodes: list[dict[str, Any]]
    gpus: int
    held_by_gates: int
