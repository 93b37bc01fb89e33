"""What the allocator is asked and what it answers, and the vocabulary both sides share.

A gate shape is the GPUs each engine gets, the same for both engines, on disjoint GPUs. Most
engines are one homogeneous group (`gpus_per_engine` on `nodes_per_engine` nodes inside one
domain of `engine_level`). A disaggregated engine is several worker groups that serve as one
unit, e.g. prefill on one host and decode on two nodes of one NVLink clique, with `connect`
rules saying which groups of one engine share a domain (a clique for NVLink, a block for RDMA).
The single-group shape is the degenerate case: one group, named `engine`, no rules.

Levels, narrowest first: host, clique, subblock, block, cluster, region, any. A domain of a
level is the set of nodes sharing that label (`domain_of`); an unlabelled level makes a node a
domain of its own: the allocator never assumes a connection the labels do not state.

Everything here is pure; `allocator.py` answers the questions, `groups.py` searches the
multi-group placements.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any, Literal, NamedTuple

from gate.reservations.inventory import Node, normalise_sku

GpuKey = tuple[str, int]  # (node name, GPU index)
ROLES = ("reference", "candidate")
Level = Literal["host", "clique", "subblock", "block", "cluster", "region", "any"]
LEVELS: tuple[Level, ...] = ("host", "clique", "subblock", "block", "cluster", "region", "any")
STAGES = (
    "region",
    "provider",
    "policy",
    "sku",
    "gpu_memory",
    "health",
    "free_capacity",
    "topology",
    "transition_headroom",
    "lease_conflict",
)
# Waiting cannot change what a node is (region, provider, pool, SKU, memory); it can bring a node
# back to health, free GPUs, or end other reservations.
RETRYABLE = {
    "region": False,
    "provider": False,
    "policy": False,
    "sku": False,
    "gpu_memory": False,
    "health": True,
    "free_capacity": True,
    "topology": True,  # refined by the allocator: False when the shape cannot fit an empty fleet
    "transition_headroom": True,
    "lease_conflict": True,
}

# A group's role becomes `{role}` in argv and part of Kubernetes object names (beside the gate
# id and the engine's role, inside a 63-character label): a short lower-case DNS label.
GROUP_ROLE_RE = re.compile(r"^[a-z]([-a-z0-9]{0,14}[a-z0-9])?$")
GROUP_ROLE_MESSAGE = (
    "must be 1-16 lower-case letters, digits or '-', starting with a letter and ending with a "
    "letter or digit (it becomes {role} in argv and part of Kubernetes names)"
)
MAX_GROUPS = 8
MAX_CONNECT = 16
SINGLE_GROUP = "engine"  # the role of the one group of a single-group shape


def level_index(level: Level) -> int:
    return LEVELS.index(level)


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """One worker group of every engine: `gpus` on `nodes` distinct nodes (the same number on
    each) inside one domain of `level`. `sku` and `min_gpu_memory_gib` default to the shape's."""

    role: str
    gpus: int
    nodes: int = 1
    level: Level = "host"
    sku: str | None = None
    min_gpu_memory_gib: float | None = None

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


@dataclass(frozen=True, slots=True)
class ConnectRule:
    """The named groups of one engine lie inside one domain of `level`."""

    groups: tuple[str, ...]
    level: Level


def _count(v: object) -> bool:
    """A positive int as written (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def group_problems(groups: Any, connect: Any, together: Any) -> list[tuple[str, str]]:
    """Rules over a shape's groups and connect rules: (path under `shape`, message) each.

    Reads raw mappings (a spec as written, so every mistake is named with its field) and skips
    values of the wrong type, which the model reports itself."""
    out: list[tuple[str, str]] = []
    groups = list(groups) if isinstance(groups, Sequence) and not isinstance(groups, str) else []
    connect = (
        list(connect) if isinstance(connect, Sequence) and not isinstance(connect, str) else []
    )
    if len(groups) > MAX_GROUPS:
        out.append(("groups", f"at most {MAX_GROUPS} groups per engine, got {len(groups)}"))
    if len(connect) > MAX_CONNECT:
        out.append(("connect", f"at most {MAX_CONNECT} rules, got {len(connect)}"))
    level_of = _group_levels(groups, out)
    if connect and not groups:
        out.append(("connect", "connect rules tie `groups` together; give `groups` first"))
    for i, rule in enumerate(connect):
        if isinstance(rule, Mapping) and groups:
            out.extend(_connect_rule_problems(i, rule, level_of))
    if groups and together in LEVELS:
        out.extend(_together_problems(together, level_of, connect))
    return out


def _group_levels(groups: list[Any], out: list[tuple[str, str]]) -> dict[str, Level]:
    """Each group's role -> its level; the groups' own mistakes appended to `out`."""
    level_of: dict[str, Level] = {}
    for i, g in enumerate(groups):
        if not isinstance(g, Mapping):
            continue
        role, gpus, nodes = g.get("role"), g.get("gpus"), g.get("nodes", 1)
        level = g.get("level", "host")
        if isinstance(role, str):
            if not GROUP_ROLE_RE.match(role):
                out.append((f"groups[{i}].role", GROUP_ROLE_MESSAGE))
            elif role in level_of:
                first = next(
                    j
                    for j, h in enumerate(groups)
                    if isinstance(h, Mapping) and h.get("role") == role
                )
                out.append((f"groups[{i}].role", f"duplicate role {role!r} (groups[{first}])"))
            else:
                level_of[role] = level if level in LEVELS else "host"
        if _count(gpus) and _count(nodes) and gpus % nodes:
            out.append(
                (
                    f"groups[{i}].gpus",
                    f"{gpus} GPUs must be a multiple of nodes ({nodes}): every node of a group "
                    "gets the same number of GPUs",
                )
            )
        if isinstance(nodes, int) and nodes > 1 and level == "host":
            out.append(
                (
                    f"groups[{i}].level",
                    f"a group of {nodes} nodes needs a level above host (clique, subblock, "
                    "block, cluster, region or any)",
                )
            )
    return level_of


def _connect_rule_problems(
    i: int, rule: Mapping[str, Any], level_of: dict[str, Level]
) -> list[tuple[str, str]]:
    """The mistakes of connect rule i: unknown or repeated groups, too few, a level too low."""
    names, level = rule.get("groups"), rule.get("level")
    if not isinstance(names, Sequence) or isinstance(names, str):
        return []
    strs = [n for n in names if isinstance(n, str)]
    unknown = [n for n in strs if n not in level_of]
    if unknown:
        known = ", ".join(sorted(level_of))
        return [(f"connect[{i}].groups", f"unknown group {unknown[0]!r}; the groups are {known}")]
    if len(set(strs)) != len(strs):
        return [(f"connect[{i}].groups", "names a group twice")]
    if len(strs) == len(names) and len(strs) < 2:
        return [(f"connect[{i}].groups", "name at least two groups to connect")]
    if level in LEVELS:
        for n in strs:
            own = level_of[n]
            if LEVELS.index(level) < LEVELS.index(own):
                return [
                    (
                        f"connect[{i}].level",
                        f"{level} is below group {n}'s own level {own}: one {level} "
                        f"cannot hold the whole {n} group; connect at {own} or above",
                    )
                ]
    return []


def _together_problems(
    together: Level, level_of: dict[str, Level], connect: list[Any]
) -> list[tuple[str, str]]:
    """`together` must be at or above every group's and every connect rule's level."""
    levels = [(f"group {r}", lv) for r, lv in level_of.items()] + [
        (f"connect[{i}]", r.get("level"))
        for i, r in enumerate(connect)
        if isinstance(r, Mapping) and r.get("level") in LEVELS
    ]
    for what, lv in levels:
        if LEVELS.index(together) < LEVELS.index(lv):
            return [
                (
                    "together",
                    f"{together} is below the level of {what} ({lv}): one {together} "
                    "domain must hold every group of both engines",
                )
            ]
    return []


@dataclass(frozen=True, slots=True)
class ShapeRequest:
    """The shape of both engines. Single-group: the `*_per_engine` fields and `engine_level`.
    Several groups: `groups` and `connect` (then those fields are not read). `together` is the
    level whose one domain holds every GPU of the gate: by default the engine level, or for
    several groups the highest level a group or a connect rule names."""

    sku: str | None = None
    min_gpu_memory_gib: float | None = None
    gpus_per_engine: int = 1
    nodes_per_engine: int = 1
    engine_level: Level = "host"
    together: Level | None = None  # None: the engine level
    regions: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    headroom_gpus: int = 0  # GPUs that must stay free in the gate's domain after placing it
    roles: tuple[str, ...] = ROLES  # the engines that need GPUs (attached ones do not)
    groups: tuple[GroupRequest, ...] = ()
    connect: tuple[ConnectRule, ...] = ()

    def __post_init__(self) -> None:
        if self.groups:
            found = group_problems(
                [asdict(g) for g in self.groups],
                [asdict(c) for c in self.connect],
                self.together,
            )
            for g in self.groups:
                if g.gpus < 1 or g.nodes < 1:
                    found.insert(0, ("groups", f"group {g.role}: gpus and nodes must be >= 1"))
            if found:
                path, message = found[0]
                raise ValueError(f"{path}: {message}")
            return
        if self.connect:
            raise ValueError("connect: connect rules tie `groups` together; give `groups` first")
        if self.gpus_per_engine < 1 or self.nodes_per_engine < 1:
            raise ValueError("gpus_per_engine and nodes_per_engine must be at least 1")
        if self.gpus_per_engine % self.nodes_per_engine:
            raise ValueError("gpus_per_engine must be a multiple of nodes_per_engine")
        if LEVELS.index(self.pair_level) < LEVELS.index(self.engine_level):
            raise ValueError("together must be a level at or above engine_level")

    @property
    def gpus_per_node(self) -> int:
        return self.gpus_per_engine // self.nodes_per_engine

    @property
    def multi_group(self) -> bool:
        """Whether the multi-group search is needed (one group without rules is the classic
        shape, counted exactly by Kueue's method)."""
        return len(self.groups) > 1 or bool(self.connect)

    @property
    def group_list(self) -> tuple[GroupRequest, ...]:
        """Every group, SKU and memory resolved from the shape where the group leaves them."""
        if not self.groups:
            return (
                GroupRequest(
                    SINGLE_GROUP,
                    self.gpus_per_engine,
                    self.nodes_per_engine,
                    self.engine_level,
                    self.sku,
                    self.min_gpu_memory_gib,
                ),
            )
        return tuple(
            GroupRequest(
                g.role,
                g.gpus,
                g.nodes,
                g.level,
                g.sku if g.sku is not None else self.sku,
                g.min_gpu_memory_gib
                if g.min_gpu_memory_gib is not None
                else self.min_gpu_memory_gib,
            )
            for g in self.groups
        )

    @property
    def pair_level(self) -> Level:
        if self.together is not None:
            return self.together
        if not self.groups:
            return self.engine_level
        levels = [g.level for g in self.groups] + [c.level for c in self.connect]
        return max(levels, key=level_index)

    @property
    def engine_gpus(self) -> int:
        """GPUs of one whole engine (every group)."""
        if not self.groups:
            return self.gpus_per_engine
        return sum(g.gpus for g in self.groups)

    @property
    def gpus_per_gate(self) -> int:
        return self.engine_gpus * len(self.roles)

    def single(self) -> ShapeRequest:
        """A one-group shape written with `groups`, as the classic shape it is."""
        (g,) = self.group_list
        return ShapeRequest(
            sku=g.sku,
            min_gpu_memory_gib=g.min_gpu_memory_gib,
            gpus_per_engine=g.gpus,
            nodes_per_engine=g.nodes,
            engine_level=g.level,
            together=self.pair_level,
            regions=self.regions,
            providers=self.providers,
            pools=self.pools,
            headroom_gpus=self.headroom_gpus,
            roles=self.roles,
        )


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """One worker group of one engine, as the launcher needs it: its nodes (the leader first)
    and, aligned with them, the GPU indices it holds on each (what `{group_gpus}` and
    CUDA_VISIBLE_DEVICES are filled from), and its domain at the group's level."""

    role: str
    nodes: tuple[str, ...]
    gpus: tuple[tuple[int, ...], ...]
    sku: str
    domain: str

    @property
    def workers(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        return tuple(zip(self.nodes, self.gpus, strict=True))

    @property
    def gpus_per_node(self) -> int:
        return len(self.gpus[0])

    def visible_devices(self, node: str | None = None) -> str:
        """CUDA_VISIBLE_DEVICES of this group on `node` (default: its leader's)."""
        i = 0 if node is None else self.nodes.index(node)
        return ",".join(str(g) for g in self.gpus[i])

    @property
    def cuda_visible_devices(self) -> str:
        return self.visible_devices()


@dataclass(frozen=True, slots=True)
class EnginePlacement:
    """One engine's GPUs. `nodes` lists every worker, group after group (a node may appear once
    per group, with disjoint GPUs); `groups` is the same split by worker group (one `engine`
    group for a single-group shape). `domain`: the engine's domain (single group), or the
    gate's `together` domain (several groups: each group's own is on its GroupPlacement)."""

    role: str
    nodes: tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPU indices) per worker
    sku: str
    domain: str
    groups: tuple[GroupPlacement, ...] = ()

    @property
    def node(self) -> str:
        """The leader's node (the only one for single-node engines)."""
        return self.nodes[0][0]

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.nodes[0][1]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)

    def group(self, role: str) -> GroupPlacement:
        for g in self.groups:
            if g.role == role:
                return g
        raise KeyError(role)


@dataclass(frozen=True, slots=True)
class Placement:
    engines: tuple[EnginePlacement, ...]
    domain: str

    def for_role(self, role: str) -> EnginePlacement:
        for e in self.engines:
            if e.role == role:
                return e
        raise KeyError(role)

    def for_group(self, role: str, group: str) -> GroupPlacement:
        """Engine `role`'s (reference, candidate) worker group `group` (prefill, decode)."""
        return self.for_role(role).group(group)

    def gpu_keys(self) -> list[tuple[str, GpuKey]]:
        return [(e.role, (n, g)) for e in self.engines for n, gpus in e.nodes for g in gpus]


class DomainFit(NamedTuple):
    domain: str
    nodes: int
    free_gpus: int
    engines: int  # disjoint engines that fit now (several groups: the engines of `gates`)
    gates: int  # gate shapes that fit now (all engines, headroom respected)


class GroupFit(NamedTuple):
    """One group of a multi-group shape on its own: where it could go, ignoring the others."""

    role: str
    eligible_nodes: int
    free_gpus: int  # on its eligible nodes
    domains: int  # domains of its level (inside `together` domains) that hold one instance
    instances: int  # disjoint instances of the group alone that fit now


@dataclass(frozen=True, slots=True)
class Capacity:
    gates: int
    engines: int
    free_gpus: int
    eligible_nodes: int
    level: Level
    per_domain: tuple[DomainFit, ...]
    groups: tuple[GroupFit, ...] = ()  # in placement order, most constrained first


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why nothing fits: the first stage that left nothing, and what each stage removed."""

    code: str
    message: str
    eliminated: dict[str, int] = field(default_factory=dict)
    retryable: bool = False
    per_domain: tuple[DomainFit, ...] = ()


# -- domains and eligibility ---------------------------------------------------------------------


def domain_of(node: Node, level: Level) -> str:
    """The node's domain at `level`. An unlabelled level makes the node a domain of its own
    (except `clique`, where an unlabelled node's NVLink domain is the host itself): never assume
    a connection the labels do not state."""
    if level == "host":
        return node.name
    if level == "cluster":
        return f"{node.region}/{node.cluster}"
    if level == "region":
        return node.region
    if level == "any":
        return "*"
    label = node.topology.get(level)
    if label:
        return f"{node.cluster}/{level}={label}"
    return node.name


def domain_key(level: Level) -> Callable[[Node], str]:
    """`domain_of` for one level, as a cheap callable for the per-node hot loop."""
    if level == "host":
        return attrgetter("name")
    return lambda x: domain_of(x, level)


def eligible(
    nodes: Sequence[Node],
    shape: ShapeRequest,
    sku: str | None = None,
    min_gpu_memory_gib: float | None = None,
) -> tuple[list[Node], dict[str, int], str | None]:
    """Apply the eligibility stages in order (one pass) for the shape, or for one group's SKU
    and memory; return the survivors, the count each stage removed, and the first stage that
    removed everything (or None)."""
    want_sku = normalise_sku(sku) if sku else None
    regions, providers, pools = set(shape.regions), set(shape.providers), set(shape.pools)
    min_mem = min_gpu_memory_gib
    names = STAGES[:6]
    removed = [0] * len(names)
    survivors: list[Node] = []
    for x in nodes:
        if regions and x.region not in regions:
            removed[0] += 1
        elif providers and x.provider not in providers:
            removed[1] += 1
        elif pools and x.pool not in pools:
            removed[2] += 1
        elif want_sku is not None and normalise_sku(x.sku) != want_sku:
            removed[3] += 1
        elif min_mem is not None and x.gpu_memory_gib < min_mem:
            removed[4] += 1
        elif not x.healthy or x.cordoned or x.taints:
            removed[5] += 1
        else:
            survivors.append(x)
    eliminated = dict(zip(names, removed, strict=True))
    if survivors:
        return survivors, eliminated, None
    # The first stage that left nothing: the last one that removed any node.
    last = max((i for i, r in enumerate(removed) if r), default=0)
    for later in names[last + 1 :]:
        eliminated.pop(later, None)
    return [], eliminated, names[last]


def stage_message(
    stage: str, shape: ShapeRequest, sku: str | None, min_gpu_memory_gib: float | None
) -> str:
    return {
        "region": f"no node in regions {list(shape.regions)}",
        "provider": f"no eligible node from providers {list(shape.providers)}",
        "policy": f"no eligible node in pools {list(shape.pools)}",
        "sku": f"no eligible node has GPU SKU {normalise_sku(sku or '')}",
        "gpu_memory": f"no eligible node has >= {min_gpu_memory_gib:g} GiB per GPU"
        if min_gpu_memory_gib is not None
        else "",
        "health": "every eligible node is unhealthy, cordoned or tainted",
    }[stage]


def headroom_blocked(
    shape: ShapeRequest, eliminated: dict[str, int], fits: tuple[DomainFit, ...]
) -> Blocked:
    """The shape fits only by eating into the transition headroom: waiting can help."""
    return Blocked(
        "transition_headroom",
        f"the shape fits only by leaving fewer than {shape.headroom_gpus} GPUs free in its "
        f"{shape.pair_level} domain",
        eliminated,
        True,
        fits,
    )


def lease_blocked(
    held_here: int, eliminated: dict[str, int], fits: tuple[DomainFit, ...]
) -> Blocked:
    """The shape would fit but for GPUs other reservations hold: waiting can help."""
    return Blocked(
        "lease_conflict",
        f"the shape would fit, but other gate reservations hold {held_here} of the eligible GPUs",
        eliminated,
        True,
        fits,
    )


def held_by_node(held: Iterable[GpuKey]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for name, g in held:
        out.setdefault(name, set()).add(g)
    return out
