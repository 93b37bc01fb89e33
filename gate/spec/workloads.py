"""A scenario's workload: where its requests come from when they are not one length of
synthetic words (docs/workloads.md).

`workload:` is one part or a `mix:` of parts, each with a `kind` and a `share`; the kinds and
the fields each takes are :data:`PART_FIELDS` (one table: the model's rule and the docs read
it). A `trace` replays a file's own instants and stands alone; every other kind starts at the
scenario's arrival instants. The file of a part is a path the operator's settings resolve
(`GATE_WORKLOAD_DIR`, gate/runs/workloads.py): the spec only names it, nothing here reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from gate.spec.fields import StrictModel

FILE_FORMATS = ("sharegpt", "trace", "openai")
PART_KINDS = ("synthetic", "long_context", "shared_prefix", "sessions", *FILE_FORMATS)

# The fields each kind takes besides `kind` and `share` (and which it needs).
PART_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "synthetic": (frozenset({"prompt_tokens", "max_tokens"}), frozenset()),
    "long_context": (frozenset({"prompt_tokens", "max_tokens"}), frozenset({"prompt_tokens"})),
    "shared_prefix": (
        frozenset({"prompt_tokens", "max_tokens", "groups", "prefix_tokens"}),
        frozenset({"prefix_tokens"}),
    ),
    "sessions": (
        frozenset({"prompt_tokens", "max_tokens", "turns", "think_s"}),
        frozenset({"turns"}),
    ),
    "sharegpt": (frozenset({"file", "max_tokens", "turns", "think_s"}), frozenset({"file"})),
    "trace": (frozenset({"file", "block_tokens"}), frozenset({"file"})),
    "openai": (frozenset({"file", "max_tokens"}), frozenset({"file"})),
}

_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,255}$")
MAX_PARTS = 16


class WorkloadPart(StrictModel):
    """One part of a workload: its kind, its share of the scenario's arrivals, its knobs
    (unset: the scenario's prompt_tokens and max_tokens)."""

    kind: Literal[PART_KINDS]  # type: ignore[valid-type]
    share: float = Field(default=1.0, gt=0, le=1_000_000, description="weight in the mix")
    file: str | None = Field(
        default=None,
        description="a workload file, relative to the operator's GATE_WORKLOAD_DIR: letters, "
        "digits and `_./-`, no `..`",
    )
    prompt_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    turns: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="sessions: turns per session; sharegpt: most turns taken per conversation",
    )
    think_s: float = Field(default=0.0, ge=0, le=3_600, description="user think time per turn")
    groups: int = Field(default=1, ge=1, le=100_000, description="distinct shared prefixes")
    prefix_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    block_tokens: int = Field(
        default=512, ge=1, le=65_536, description="tokens per trace hash block (Mooncake: 512)"
    )


def part_problems(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each field the part's kind does not take or needs and lacks,
    and a file name that is not a plain relative path; on the raw mapping, so each is named."""
    kind = raw.get("kind")
    if kind not in PART_FIELDS:
        return []
    takes, needs = PART_FIELDS[kind]
    out = [
        (key, f"not a field of a {kind} part (its fields: {', '.join(sorted(takes))}, share)")
        for key in raw
        if key not in takes and key not in ("kind", "share") and raw[key] is not None
    ]
    out += [(key, f"required by a {kind} part") for key in sorted(needs) if raw.get(key) is None]
    name = raw.get("file")
    if isinstance(name, str) and not _plain_relative(name):
        out.append(
            (
                "file",
                "a path relative to the operator's workload directory: letters, digits and "
                "`_./-`, no `..`, no leading `/`",
            )
        )
    return out


def _plain_relative(name: str) -> bool:
    return bool(_FILE_RE.fullmatch(name)) and ".." not in name.split("/") and "//" not in name


class WorkloadSpec(StrictModel):
    """Where a scenario's requests come from: one part written inline, or `mix:` of parts."""

    mix: list[WorkloadPart] = Field(min_length=1, max_length=MAX_PARTS)

    @model_validator(mode="before")
    @classmethod
    def _one_part(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "mix" not in data and "kind" in data:
            return {"mix": [dict(data)]}
        return data

    @model_validator(mode="after")
    def _parts_of_kind(self) -> WorkloadSpec:
        # Here rather than on each part, so that the model's error is at `workload`, above
        # the raw pass's exact field (parsing.py keeps the exact one).
        for part in self.mix:
            if problems := part_problems(part.model_dump(exclude_unset=True)):
                raise ValueError(problems[0][1])
        if len(self.mix) > 1 and any(p.kind == "trace" for p in self.mix):
            raise ValueError(TRACE_ALONE)
        return self

    @property
    def trace(self) -> WorkloadPart | None:
        """The trace part, when the workload replays one (it is then the only part)."""
        return self.mix[0] if self.mix[0].kind == "trace" else None

    @property
    def multi_turn(self) -> bool:
        return any(p.kind == "sharegpt" or (p.turns or 1) > 1 for p in self.mix)


TRACE_ALONE = "a trace replays its own instants, so it stands alone: no other part beside it"


def workload_problems(raw: Any) -> list[tuple[str, str]]:
    """Each part's problems on the raw mapping, named `workload.mix[i].field` (or
    `workload.field` for a part written inline)."""
    if not isinstance(raw, Mapping):
        return []
    if "mix" not in raw:
        return [(f"workload.{f}", m) for f, m in part_problems(raw)] if "kind" in raw else []
    parts = raw.get("mix")
    if not isinstance(parts, list):
        return []
    out = [
        (f"workload.mix[{i}].{f}", m)
        for i, p in enumerate(parts)
        if isinstance(p, Mapping)
        for f, m in part_problems(p)
    ]
    if len(parts) > 1 and any(isinstance(p, Mapping) and p.get("kind") == "trace" for p in parts):
        out.append(("workload.mix", TRACE_ALONE))
    return out
