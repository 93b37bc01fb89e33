"""The gate spec: what to compare, on which GPU shape, under which load, judged by which policy.

Specs are written by people, so loading one reports every mistake at once, each with the path of
the field (``scenarios[0].rate``) and what is wrong with it.

One module per concern: `fields` (what every part shares: the strict base model, names,
placeholders, size bounds), `kinds` (the engine kinds, one registry), `engines` (an engine and
the rules between engines), `kubernetes` (a kubernetes engine), `scenarios`, `shape`,
`gate_spec` (the whole spec), `parsing` (reading one, every mistake named) and `limits` (a
spec against the operator's caps). What callers use is re-exported here.
"""

from __future__ import annotations

from gate.spec.engines import MIXED_KUBERNETES_MESSAGE, EngineSpec
from gate.spec.fields import MAX_SPEC_STRING, MAX_URL_CHARS, NAME_RE
from gate.spec.gate_spec import GateSpec
from gate.spec.kinds import ENGINE_KINDS, EngineKind, KindName, Runtime
from gate.spec.kubernetes import (
    KubernetesGroupSpec,
    KubernetesRouterSpec,
    KubernetesSpec,
    check_image,
    image_repository,
)
from gate.spec.limits import ScenarioSize, scenario_size, spec_limit_problems
from gate.spec.parsing import (
    load_spec,
    parse_spec,
    parse_spec_text,
    policy_problems,
    spec_to_dict,
)
from gate.spec.scenarios import ScenarioSpec
from gate.spec.shape import ShapeSpec

__all__ = [
    "ENGINE_KINDS",
    "MAX_SPEC_STRING",
    "MAX_URL_CHARS",
    "MIXED_KUBERNETES_MESSAGE",
    "NAME_RE",
    "EngineKind",
    "EngineSpec",
    "GateSpec",
    "KindName",
    "KubernetesGroupSpec",
    "KubernetesRouterSpec",
    "KubernetesSpec",
    "Runtime",
    "ScenarioSize",
    "ScenarioSpec",
    "ShapeSpec",
    "check_image",
    "image_repository",
    "load_spec",
    "parse_spec",
    "parse_spec_text",
    "policy_problems",
    "scenario_size",
    "spec_limit_problems",
    "spec_to_dict",
]
