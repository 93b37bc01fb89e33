"""An engine of a gate spec, and the rules that tie an engine to the shape and to the other
engine; what kind of engine it is, and what that kind needs, is `gate/spec/kinds.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from gate.core.errors import FieldProblem, UrlRefused
from gate.spec.fields import (
    GROUP_PLACEHOLDERS,
    GROUP_REF_RE,
    MAX_URL_CHARS,
    PLACEHOLDERS,
    StrictModel,
)
from gate.spec.kinds import (
    ENGINE_KINDS,
    EngineKind,
    KindName,
    Runtime,
    companion_problem,
    kind_of,
    kind_problem,
)
from gate.spec.kubernetes import KubernetesSpec


class EngineSpec(StrictModel):
    """An engine to launch (`command`, an argv list, or a `preset`), one run as pods on a
    cluster (`kubernetes`), one already running (`url`), or worker groups behind a router
    (`groups`): its `kind` (kinds.py), named or told by the one of those fields it gives."""

    # Never dumped: it always agrees with the one kind field given, so a spec written with or
    # without it is the same spec (store.spec_key) and is stored as it was before `kind`.
    kind: KindName | None = Field(
        default=None,
        exclude=True,
        description="command, preset, url, kubernetes or groups: the field that holds the "
        "engine's settings; default: the one of those fields that is given",
    )

    command: list[str] | None = Field(
        default=None,
        description="argv of the engine; {port}, {host}, {model}, {gpus}, {tp} are filled in.",
    )
    preset: Literal["vllm", "sglang", "trtllm", "sim"] | None = Field(
        default=None, description="a known engine: the gate builds its argv (see presets.py)"
    )
    binary: str | None = Field(
        default=None, description="with a preset: the engine's program, e.g. a venv's vllm"
    )
    python: str | None = Field(
        default=None,
        description="with a module preset (sglang, sim), or vllm launched as a module: "
        "the interpreter to use (a virtualenv's python)",
    )
    args: list[str] = Field(default_factory=list, description="with a preset: extra arguments")
    url: str | None = Field(
        default=None, max_length=MAX_URL_CHARS, description="Base URL of a running engine."
    )
    kubernetes: KubernetesSpec | None = Field(
        default=None, description="run the engine as pods on the nodes the gate reserves"
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    cwd: str | None = Field(default=None, description="Working directory of the process.")
    readiness_timeout_s: float = Field(default=300.0, gt=0, le=7200)
    metrics_path: str | None = Field(
        default="/metrics",
        max_length=200,
        pattern=r"^/[A-Za-z0-9_./~-]*(\?[A-Za-z0-9_.=&-]*)?$",
        description="the engine's Prometheus endpoint, a path on its URL (vLLM, SGLang with "
        "--enable-metrics, llama.cpp with --metrics, the sim: /metrics; TensorRT-LLM: "
        "/prometheus/metrics); null: it has none (its engine checks are notes)",
    )
    caller_url: bool = Field(
        default=False,
        description="set by the service when a request named this `url`: the engine checks "
        "it against GATE_ENGINE_URL_ALLOW again when it attaches (a request cannot set it)",
    )
    groups: dict[str, EngineSpec] | None = Field(
        default=None,
        description="an engine of several worker groups (the shape's `groups`): one process "
        "(`command` or `preset`) per group role, e.g. {prefill: {preset: sim, args: [--role, "
        "prefill]}, decode: {...}}, with a `router` in front",
    )
    router: EngineSpec | None = Field(
        default=None,
        description="with `groups`: the engine's entry point (`command` or `preset`), given "
        "the groups' addresses as {url:GROUP}, {host:GROUP}, {port:GROUP}",
    )

    @field_validator("command")
    @classmethod
    def _command_ok(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("must not be empty: give the program and its arguments as a list")
        if not v[0].strip():
            raise ValueError("the program name (first item) is empty")
        for item in v:
            for name in re.findall(r"\{([^{}]*)\}", item):
                if name not in PLACEHOLDERS + GROUP_PLACEHOLDERS and not GROUP_REF_RE.match(name):
                    raise ValueError(
                        f"unknown placeholder {{{name}}}; use one of "
                        + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                        + " (in a group or router: also {role}, {group_gpus}, {url:GROUP}, "
                        "{host:GROUP}, {port:GROUP})"
                    )
        return v

    @field_validator("url")
    @classmethod
    def _url_ok(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from gate.access.network import check_always, check_syntax

        try:
            clean = check_syntax(v)
            check_always(clean, resolve=None)  # names resolve when the engine attaches
        except UrlRefused as exc:
            raise ValueError(str(exc)) from None
        return clean

    @model_validator(mode="after")
    def _one_kind(self) -> EngineSpec:
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        problem = kind_problem(fields)
        name = kind_of(fields)
        if problem is None and name is not None:
            problem = companion_problem(name, fields) or ENGINE_KINDS[name].check(self)
        if problem is not None:
            raise ValueError(problem)
        if self.kind is None:  # told by its field (the model is frozen once validated)
            object.__setattr__(self, "kind", name)
        return self

    @property
    def engine_kind(self) -> EngineKind:
        """This engine's entry in ENGINE_KINDS (told by its field if it was built unvalidated,
        `model_construct`)."""
        name = self.kind or kind_of(self.__dict__)
        assert name is not None, "an engine gives exactly one kind field"
        return ENGINE_KINDS[name]

    @property
    def runtime(self) -> Runtime:
        """How it runs: a local `process`, an attached `endpoint` or `kubernetes` pods."""
        return self.engine_kind.runtime

    @property
    def label(self) -> str:
        """What a person calls this engine in a list: its URL, preset and program, argv, or
        image."""
        return self.engine_kind.label(self)

    def argv_template(self, group: str | None = None) -> list[str]:
        """The argv with placeholders; `group` names the worker group (or `router`) this spec
        is, so a preset adds that role's flags (presets.py: GROUP_FLAGS, ROUTERS)."""
        if self.command is not None:
            return list(self.command)
        from gate.engines.presets import preset_argv

        assert self.preset is not None
        return preset_argv(
            self.preset,
            binary=self.binary,
            python=self.python,
            args=tuple(self.args),
            group=group,
        )


def engine_group_problems(role: str, es: EngineSpec, shape_groups: list[str]) -> list[FieldProblem]:
    """An engine's groups against the shape's, as its kind rules them (kinds.py): one engine
    group per shape group and no other, `{url:GROUP}` naming a group of the engine, group
    placeholders only where groups are (`url` engines run wherever they run)."""
    return es.engine_kind.group_problems(role, es, shape_groups)


MIXED_KUBERNETES_MESSAGE = (
    "a kubernetes engine is compared with another kubernetes engine (or a `url`), not with a "
    "local process: the two would not run under the same conditions"
)
OTHER_CLUSTER_MESSAGE = (
    "both kubernetes engines must be on one cluster: give them the same `kubeconfig`, "
    "`context`, `in_cluster` and `cluster`"
)


def engine_pair_problems(data: Mapping[str, Any]) -> list[FieldProblem]:
    """Rules that tie the two engines together, checked on the raw spec."""
    engines = {r: data.get(r) for r in ("reference", "candidate")}
    kinds: dict[str, EngineKind] = {}
    for role, eng in engines.items():
        if isinstance(eng, Mapping) and (name := kind_of(eng)) is not None:
            kinds[role] = ENGINE_KINDS[name]
    runtimes = [k.runtime for k in kinds.values()]
    problems: list[FieldProblem] = []
    if "kubernetes" in runtimes and "process" in runtimes:
        local = next(r for r, k in kinds.items() if k.runtime == "process")
        problems.append(FieldProblem(local, MIXED_KUBERNETES_MESSAGE))
    if runtimes.count("kubernetes") == 2:
        ref, cand = (dict(engines[r] or {}).get("kubernetes") for r in ("reference", "candidate"))
        if isinstance(ref, Mapping) and isinstance(cand, Mapping):
            keys = ("kubeconfig", "context", "cluster")
            same = all(ref.get(k) == cand.get(k) for k in keys)
            if not same or bool(ref.get("in_cluster")) != bool(cand.get("in_cluster")):
                problems.append(FieldProblem("candidate.kubernetes", OTHER_CLUSTER_MESSAGE))
    return problems
