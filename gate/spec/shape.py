"""The GPU shape each engine gets: one group, or worker groups with rules between them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from gate.reservations.allocator import LEVELS, ConnectRule, GroupRequest, Level, ShapeRequest
from gate.reservations.shapes import GROUP_ROLE_MESSAGE, GROUP_ROLE_RE, group_problems
from gate.spec.fields import MAX_LIST_ITEMS, StrictModel


class GroupSpec(StrictModel):
    """One worker group of each engine (e.g. prefill, decode): `gpus` on `nodes` distinct nodes,
    the same number on each, inside one domain of `level`."""

    role: str = Field(
        description="the group's name: 1-16 lower-case letters, digits or '-' (it becomes "
        "{role} in argv and part of Kubernetes names)"
    )
    gpus: int = Field(ge=1, le=4096, description="GPUs of this group in one engine")
    nodes: int = Field(default=1, ge=1, le=512, description="distinct nodes they are spread on")
    level: Level = Field(default="host", description="the level whose one domain holds the group")
    sku: str | None = Field(default=None, description="GPU product; default: the shape's")
    min_gpu_memory_gib: float | None = Field(default=None, gt=0, description="default: the shape's")

    @field_validator("role")
    @classmethod
    def _role_ok(cls, v: str) -> str:
        if not GROUP_ROLE_RE.match(v):
            raise ValueError(GROUP_ROLE_MESSAGE)
        return v


class ConnectSpec(StrictModel):
    """The named groups of one engine lie inside one domain of `level` (a clique for NVLink
    between prefill and decode, a block for RDMA)."""

    groups: list[str] = Field(description="two or more group roles")
    level: Level


SINGLE_GROUP_FIELDS = ("gpus_per_engine", "nodes_per_engine", "engine_level")


def shape_problems(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rules over a shape's groups, checked on the raw mapping so each names its field
    (`groups[1].nodes`, `connect[0].groups`) beside every other mistake."""
    groups = raw.get("groups")
    out: list[tuple[str, str]] = []
    if groups:
        out += [
            (k, "not used with `groups`: each group gives its own gpus, nodes and level")
            for k in SINGLE_GROUP_FIELDS
            if k in raw
        ]
    return out + group_problems(groups, raw.get("connect"), raw.get("together"))


class ShapeSpec(StrictModel):
    """The GPU shape each engine gets; both engines get the same shape, on disjoint GPUs.

    One group (`gpus_per_engine` on `nodes_per_engine` nodes in one `engine_level` domain), or
    several worker groups that serve as one engine (`groups`, e.g. prefill and decode) with
    `connect` rules between them; every group of both engines is placed, or none."""

    sku: str | None = Field(default=None, description="GPU product, e.g. H200; any when unset")
    min_gpu_memory_gib: float | None = Field(default=None, gt=0)
    gpus_per_engine: int = Field(default=1, ge=1, le=4096)
    nodes_per_engine: int = Field(default=1, ge=1, le=512)
    engine_level: Level = Field(
        default="host", description="the topology level that must contain each whole engine"
    )
    together: Level | None = Field(
        default=None,
        description="the level whose one domain holds both engines (default: engine_level; with "
        "`groups`, the highest level a group or connect rule names); `any` only asks for the "
        "same SKU class",
    )
    groups: list[GroupSpec] = Field(
        default_factory=list,
        description="worker groups of each engine (at most 8, roles unique); instead of "
        "gpus_per_engine, nodes_per_engine and engine_level",
    )
    connect: list[ConnectSpec] = Field(
        default_factory=list,
        description="groups of one engine that share one domain of a level, e.g. "
        "{groups: [prefill, decode], level: clique}",
    )
    regions: list[str] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="allowed regions (any if empty)",
    )
    providers: list[str] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    pools: list[str] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    headroom_gpus: int = Field(default=0, ge=0, description="GPUs to leave free in the domain")
    wait_s: float = Field(
        default=0.0, ge=0, le=86_400, description="wait this long for capacity when blocked"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ShapeSpec:
        if self.groups or self.connect:
            raw = self.model_dump(exclude_unset=True)
            raw["together"] = self.together
            if problems := shape_problems(raw):
                # The message alone: parse_spec names the field from the raw pass.
                raise ValueError(problems[0][1])
            return self
        if self.gpus_per_engine % self.nodes_per_engine:
            raise ValueError("gpus_per_engine must be a multiple of nodes_per_engine")
        if self.nodes_per_engine > 1 and self.engine_level == "host":
            raise ValueError(
                "a multi-node engine needs an engine_level above host (clique, subblock, block, "
                "cluster, region or any)"
            )
        if LEVELS.index(self.together or self.engine_level) < LEVELS.index(self.engine_level):
            raise ValueError("together must be at or above engine_level")
        return self

    def request(self, roles: tuple[str, ...]) -> ShapeRequest:
        return ShapeRequest(
            sku=self.sku,
            min_gpu_memory_gib=self.min_gpu_memory_gib,
            gpus_per_engine=self.gpus_per_engine,
            nodes_per_engine=self.nodes_per_engine,
            engine_level=self.engine_level,
            together=self.together,
            regions=tuple(self.regions),
            providers=tuple(self.providers),
            pools=tuple(self.pools),
            headroom_gpus=self.headroom_gpus,
            roles=roles,
            groups=tuple(
                GroupRequest(g.role, g.gpus, g.nodes, g.level, g.sku, g.min_gpu_memory_gib)
                for g in self.groups
            ),
            connect=tuple(ConnectRule(tuple(c.groups), c.level) for c in self.connect),
        )
