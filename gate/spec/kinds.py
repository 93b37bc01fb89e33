"""Engine kinds: what an engine of a spec is, in one registry.

An engine's `kind` is one of `ENGINE_KINDS` (command, preset, url, kubernetes, groups). A spec
may say it (`kind: url`); when it does not, the kind is the one kind field it gives (`url:
http://...` is a `url` engine), so specs written before `kind` existed parse unchanged. Each
entry says everything the rest of the gate asks of a kind:

- what it needs: its own field (named as the kind), the fields that go only with it
  (`companions`: a preset's `binary`, `python`, `args`), and its own rules (`check`);
- how it meets the shape (`group_problems`): worker groups, group placeholders;
- how it runs (`runtime`: a local `process`, an attached `endpoint`, `kubernetes` pods; the
  runtime picks the launcher that builds its `Engine`, `gate/runs/engines.py` LAUNCHERS, and
  is the engine's `kind` in the verdict document) and whether the gate launches it on GPUs it
  reserves (`launched`);
- how a person sees it (`label`) and how the spec's help names it (`summary`).

A new kind is one entry here (and its tests): its field on `EngineSpec` and, only when it
runs in a way no runtime covers yet, an `Engine` class in gate/engines and its launcher.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gate.core.errors import FieldProblem
from gate.spec.fields import GROUP_PLACEHOLDERS, GROUP_REF_RE
from gate.spec.kubernetes import kubernetes_group_problems

if TYPE_CHECKING:
    from gate.spec.engines import EngineSpec

KindName = Literal["command", "preset", "url", "kubernetes", "groups"]
Runtime = Literal["process", "endpoint", "kubernetes"]


@dataclass(frozen=True, slots=True)
class EngineKind:
    """One kind of engine (module docstring): its name is also the spec field that holds it."""

    name: KindName
    summary: str
    runtime: Runtime
    launched: bool
    label: Callable[[EngineSpec], str]
    companions: tuple[str, ...] = ()
    companion_message: str = ""
    check: Callable[[EngineSpec], str | None] = lambda es: None
    group_problems: Callable[[str, EngineSpec, list[str]], list[FieldProblem]] = (
        lambda role, es, shape_groups: []
    )


def _placeholders(es: EngineSpec) -> set[str]:
    return {
        n for item in [*(es.command or []), *es.args] for n in re.findall(r"\{([^{}]*)\}", item)
    }


def _local_group_problems(role: str, es: EngineSpec, shape_groups: list[str]) -> list[FieldProblem]:
    """A single local process: no group placeholders, and no shape with worker groups."""
    out: list[FieldProblem] = []
    used = sorted(n for n in _placeholders(es) if n in GROUP_PLACEHOLDERS or GROUP_REF_RE.match(n))
    if used:
        out.append(FieldProblem(role, f"{{{used[0]}}} is for the argv of a worker group or router"))
    if shape_groups:
        out.append(
            FieldProblem(
                f"{role}.groups",
                "the shape has worker groups (" + ", ".join(shape_groups) + "): give the "
                "engine one `groups` entry per group and a `router`",
            )
        )
    return out


def _preset_label(es: EngineSpec) -> str:
    parts = [es.preset or "", es.binary or es.python or "", *es.args]
    return " ".join(p for p in parts if p)[:500]


def _kubernetes_check(es: EngineSpec) -> str | None:
    if es.env or es.cwd:
        return (
            "`env` and `cwd` are for local processes; a kubernetes engine's environment "
            "goes in `kubernetes.env`"
        )
    return None


def _kubernetes_group_problems(
    role: str, es: EngineSpec, shape_groups: list[str]
) -> list[FieldProblem]:
    assert es.kubernetes is not None
    return kubernetes_group_problems(role, es.kubernetes, shape_groups)


def _groups_check(es: EngineSpec) -> str | None:
    assert es.groups is not None
    if es.router is None:
        return (
            "an engine with `groups` needs a `router`: its entry point, which the gate "
            "loads (e.g. {preset: sim} or a `command`)"
        )
    if es.env or es.cwd:
        return "with `groups`, `env` and `cwd` go on each group and the router"
    for name, member in [*es.groups.items(), ("router", es.router)]:
        if member.kind not in ("command", "preset"):
            return (
                f"{name}: a group or router is a local process (`command` or "
                "`preset`); nested groups, `url` and `kubernetes` are not supported"
            )
    return None


def _groups_label(es: EngineSpec) -> str:
    assert es.groups is not None and es.router is not None
    parts = [f"{name}: {g.label}" for name, g in es.groups.items()]
    return "; ".join([*parts, f"router: {es.router.label}"])[:500]


def _groups_group_problems(
    role: str, es: EngineSpec, shape_groups: list[str]
) -> list[FieldProblem]:
    """One engine group per shape group and no other, `{url:GROUP}` naming a group of the
    engine, and a router preset only where it serves the groups it is given."""
    assert es.groups is not None
    if not shape_groups:
        return [
            FieldProblem(f"{role}.groups", "the shape has no `groups`: add shape.groups for them")
        ]
    out = [
        FieldProblem(
            f"{role}.groups.{name}",
            "not a group of the shape (its groups: " + ", ".join(shape_groups) + ")",
        )
        for name in es.groups
        if name not in shape_groups
    ]
    out += [
        FieldProblem(f"{role}.groups.{name}", "missing: the shape has this group")
        for name in shape_groups
        if name not in es.groups
    ]
    for name, member in [*es.groups.items(), ("router", es.router)]:
        if member is None:
            continue
        for ph in sorted(_placeholders(member)):
            m = GROUP_REF_RE.match(ph)
            if m and m.group(2) not in es.groups:
                out.append(
                    FieldProblem(
                        f"{role}.groups.{name}" if name != "router" else f"{role}.router",
                        f"{{{ph}}} names no group of this engine",
                    )
                )
    return out + _router_preset_problems(role, es)


def _router_preset_problems(role: str, es: EngineSpec) -> list[FieldProblem]:
    if es.router is None or es.router.preset is None or es.groups is None:
        return []
    from gate.engines.presets import ROUTERS

    if ROUTERS.get(es.router.preset) is None:
        return [FieldProblem(f"{role}.router.preset", "no router preset of this name")]
    if set(es.groups) != {"prefill", "decode"}:
        return [
            FieldProblem(
                f"{role}.router.preset",
                "a router preset serves groups named prefill and decode; give a `command`",
            )
        ]
    return []


ENGINE_KINDS: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind(
            name="command",
            summary="`command` (an argv to launch)",
            runtime="process",
            launched=True,
            label=lambda es: " ".join(es.command or [])[:500],
            group_problems=_local_group_problems,
        ),
        EngineKind(
            name="preset",
            summary="`preset` (vllm, sglang, trtllm, sim)",
            runtime="process",
            launched=True,
            label=_preset_label,
            companions=("binary", "python", "args"),
            companion_message="`binary`, `python` and `args` go with a `preset`",
            group_problems=_local_group_problems,
        ),
        EngineKind(
            name="kubernetes",
            summary="`kubernetes` (run an image as pods on the reserved nodes)",
            runtime="kubernetes",
            launched=True,
            label=lambda es: es.kubernetes.image if es.kubernetes is not None else "",
            check=_kubernetes_check,
            group_problems=_kubernetes_group_problems,
        ),
        EngineKind(
            name="url",
            summary="`url` (attach to a running engine)",
            runtime="endpoint",
            launched=False,
            label=lambda es: es.url or "",
            companions=("caller_url",),
            companion_message="`caller_url` goes with a `url`",
        ),
        EngineKind(
            name="groups",
            summary="`groups` (worker groups behind a `router`)",
            runtime="process",
            launched=True,
            label=_groups_label,
            companions=("router",),
            companion_message="`router` goes with `groups`",
            check=_groups_check,
            group_problems=_groups_group_problems,
        ),
    )
}
"""Every engine kind by name, in the order the spec's help lists them."""

ENGINE_KIND_MESSAGE = (
    "give exactly one of "
    + ", ".join(k.summary for k in list(ENGINE_KINDS.values())[:-1])
    + " or "
    + list(ENGINE_KINDS.values())[-1].summary
)


def companion_problem(name: str, engine: Mapping[str, Any]) -> str | None:
    """The first field given that goes only with another kind than `name` (a `binary`
    without a `preset`), as that kind says it; None when there is none."""
    for other, kind in ENGINE_KINDS.items():
        if other != name and any(engine.get(f) for f in kind.companions):
            return kind.companion_message
    return None


def kinds_given(engine: Mapping[str, Any]) -> list[str]:
    """The kinds whose field an engine (a raw mapping or a spec's fields) gives."""
    return [name for name in ENGINE_KINDS if engine.get(name) is not None]


def _named(engine: Mapping[str, Any]) -> str | None:
    """The `kind` an engine names, when it is one (else the model names the field)."""
    named = engine.get("kind")
    return named if isinstance(named, str) and named in ENGINE_KINDS else None


def kind_of(engine: Mapping[str, Any]) -> str | None:
    """The engine's kind: the `kind` it names, else the one kind field it gives; None when
    that is not exactly one, or is not the `kind` named."""
    given = kinds_given(engine)
    named = _named(engine)
    if named is not None:
        return named if given == [named] else None
    return given[0] if len(given) == 1 else None


def kind_problem(engine: Mapping[str, Any]) -> str | None:
    """Why an engine's kind cannot be told: not exactly one kind field given
    (ENGINE_KIND_MESSAGE), or a `kind` named without its field or beside another's."""
    if kind_of(engine) is not None:
        return None
    named = _named(engine)
    if named is None:
        return ENGINE_KIND_MESSAGE
    others = [k for k in kinds_given(engine) if k != named]
    if others:
        return f"`kind: {named}` is given with `{others[0]}`, a field of another kind"
    return f"`kind: {named}` needs its `{named}` field"
