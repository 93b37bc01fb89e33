"""Reading a spec: every mistake at once, each named by its field path."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from gate.analysis.advisory import unmatched
from gate.core.errors import FieldProblem, SpecError
from gate.spec.engines import engine_group_problems, engine_pair_problems
from gate.spec.fields import MAX_SPEC_BYTES
from gate.spec.gate_spec import GateSpec
from gate.spec.kinds import kind_problem
from gate.spec.scenarios import (
    SUITE_OWN_KEYS,
    SUITES,
    scenario_cross_field_problems,
    suite_knob_problems,
)
from gate.spec.shape import shape_problems


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "(spec)"


def _message(err: Mapping[str, Any]) -> str:
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    return msg


_AT_ADVISORY = re.compile(r"^(advisory\[\d+\]): (.*)$", re.S)


def _at_field(problem: FieldProblem) -> FieldProblem:
    """The policy's advisory rule fails on the model (it needs the whole policy); its message
    names the entry, which becomes the path: `policy.advisory[2]`."""
    m = _AT_ADVISORY.match(problem.message)
    if m is None or not problem.path.endswith("policy"):
        return problem
    return FieldProblem(f"{problem.path}.{m.group(1)}", m.group(2))


def policy_problems(exc: ValidationError) -> list[FieldProblem]:
    """A policy's own mistakes (re-judge validates one alone), each at its path."""
    return [
        _at_field(FieldProblem(_format_loc(("policy", *e["loc"])), _message(e)))
        for e in exc.errors()
    ]


def parse_spec(data: Any, source: str = "spec") -> GateSpec:
    """Validate a spec mapping; raise SpecError naming every mistake."""
    if not isinstance(data, Mapping):
        raise SpecError([FieldProblem("(spec)", "must be a mapping of fields")], source)
    problems: list[FieldProblem] = []
    scenarios = data.get("scenarios")
    if isinstance(scenarios, list):
        for i, sc in enumerate(scenarios):
            if isinstance(sc, Mapping) and isinstance(sc.get("suite"), str):
                if sc["suite"] in SUITES:
                    knobs = {k: v for k, v in sc.items() if k not in SUITE_OWN_KEYS}
                    for field, msg in suite_knob_problems(sc["suite"], knobs):
                        problems.append(FieldProblem(f"scenarios[{i}].{field}", msg))
            elif isinstance(sc, Mapping):
                for field, msg in scenario_cross_field_problems(sc):
                    problems.append(FieldProblem(f"scenarios[{i}].{field}", msg))
    for role in ("reference", "candidate"):
        eng = data.get(role)
        if isinstance(eng, Mapping) and (kind := kind_problem(eng)) is not None:
            problems.append(FieldProblem(role, kind))
    shape = data.get("shape")
    if isinstance(shape, Mapping):
        for field, msg in shape_problems(shape):
            problems.append(FieldProblem(f"shape.{field}", msg))
    problems += engine_pair_problems(data)  # rules that tie the two engines together
    try:
        spec = GateSpec.model_validate(dict(data))
    except ValidationError as exc:
        # A cross-field rule fails on the model (path without the field); the raw pass above
        # already named the exact field, so skip the model-level duplicate. Indexed by message
        # so a spec with thousands of mistakes costs linear time, not quadratic.
        raw: dict[str, list[str]] = {}
        for p in problems:
            raw.setdefault(p.message, []).append(p.path)
        for err in exc.errors():
            problem = _at_field(FieldProblem(_format_loc(tuple(err["loc"])), _message(err)))
            if any(path.startswith(problem.path) for path in raw.get(problem.message, ())):
                continue
            problems.append(problem)
        raise SpecError(problems, source) from None
    names = [g.role for g in spec.shape.groups]
    for role in ("reference", "candidate"):  # each engine's groups against the shape's
        problems += engine_group_problems(role, spec.engine(role), names)  # type: ignore[arg-type]
    stages = [s.name for s in spec.stages]
    for i, why in unmatched(spec.policy.advisory, spec.policy, stages):  # by scenario now
        problems.append(FieldProblem(f"policy.advisory[{i}]", why))
    if problems:  # rules on both engines together (the model passed each alone)
        raise SpecError(problems, source)
    return spec


def load_spec(path: str | Path) -> GateSpec:
    """Read a YAML or JSON spec file and validate it."""
    p = Path(path)
    source = str(p)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise SpecError([FieldProblem("(file)", f"cannot read: {exc.strerror}")], source) from None
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            [FieldProblem("(file)", f"is {size} bytes; the limit is {MAX_SPEC_BYTES}")], source
        )
    text = p.read_text(encoding="utf-8")
    return parse_spec_text(text, source, json_only=p.suffix.lower() == ".json")


def parse_spec_text(text: str, source: str = "spec", *, json_only: bool = False) -> GateSpec:
    try:
        data = json.loads(text) if json_only else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        msg = f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        raise SpecError([FieldProblem("(file)", msg)], source) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        unreadable = FieldProblem("(file)", f"not a spec: {str(exc)[:200]}")
        raise SpecError([unreadable], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(
            [FieldProblem("(file)", f"invalid YAML{where}: {problem}")], source
        ) from None
    return parse_spec(data, source)


def spec_to_dict(spec: GateSpec) -> dict[str, Any]:
    """The spec as its author wrote it (fields left to their defaults stay out), so that
    `parse_spec(spec_to_dict(spec)) == spec`: stored specs are re-read by workers."""
    return spec.model_dump(mode="json", exclude_unset=True)
