"""Turn what a caller sends (a whole spec, or the name of a stored spec with the reference and
candidate given separately) into a validated GateSpec. Every mistake is named by its field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gate.core.errors import FieldProblem, SpecError
from gate.core.settings import Settings
from gate.spec import NAME_RE, GateSpec, load_spec, parse_spec, spec_to_dict


def resolve_spec(
    settings: Settings,
    *,
    spec: Mapping[str, Any] | None = None,
    spec_name: str | None = None,
    reference: Mapping[str, Any] | None = None,
    candidate: Mapping[str, Any] | None = None,
    reference_image: str | None = None,
    candidate_image: str | None = None,
    source: str = "request",
) -> GateSpec:
    """`spec` inline, or `spec_name` from settings.spec_dir; `reference`/`candidate`, when
    given, replace the spec's engines; `reference_image`/`candidate_image` replace only the
    image of a Kubernetes engine (what a rollout controller knows: the new image)."""
    if not settings.api_process_engines:
        _refuse_local_programs(spec, reference, candidate, source)
    if (spec is None) == (spec_name is None):
        raise SpecError([FieldProblem("spec", "give exactly one of `spec` or `spec_name`")], source)
    if spec_name is not None:
        data: dict[str, Any] = spec_to_dict(_named(settings, spec_name, source))
        where = f"spec {spec_name!r}"
    else:
        assert spec is not None
        data = dict(spec)
        where = source
    if reference is not None:
        data["reference"] = dict(reference)
    if candidate is not None:
        data["candidate"] = dict(candidate)
    problems: list[FieldProblem] = []
    for role, image in (("reference", reference_image), ("candidate", candidate_image)):
        if image is None:
            continue
        engine = data.get(role)
        if not isinstance(engine, Mapping) or not isinstance(engine.get("kubernetes"), Mapping):
            problems.append(
                FieldProblem(
                    f"{role}_image",
                    f"the spec's {role} is not a kubernetes engine, so it has no image to replace",
                )
            )
            continue
        data[role] = {**engine, "kubernetes": {**engine["kubernetes"], "image": image}}
    if problems:
        raise SpecError(problems, where)
    return parse_spec(data, where)


def _named(settings: Settings, name: str, source: str) -> GateSpec:
    if not NAME_RE.match(name):
        raise SpecError(
            [FieldProblem("spec_name", "use 1-63 letters, digits, '.', '_' or '-'")], source
        )
    if settings.spec_dir is None:
        raise SpecError(
            [FieldProblem("spec_name", "no named specs here (GATE_SPEC_DIR is not set)")], source
        )
    for suffix in (".yaml", ".yml", ".json"):
        path = settings.spec_dir / f"{name}{suffix}"
        if path.is_file():
            return load_spec(path)
    raise SpecError([FieldProblem("spec_name", f"no spec named {name!r} in GATE_SPEC_DIR")], source)


LOCAL_PROGRAMS = (
    "launching local programs from a request is off (set GATE_API_PROCESS_ENGINES=true, or "
    "put the spec in GATE_SPEC_DIR and send its name)"
)


def _refuse_local_programs(
    spec: Mapping[str, Any] | None,
    reference: Mapping[str, Any] | None,
    candidate: Mapping[str, Any] | None,
    source: str,
) -> None:
    """A request may name images and URLs, but not programs to run on the worker's host."""
    engines: list[tuple[str, Any]] = []
    if isinstance(spec, Mapping):
        engines += [(role, spec.get(role)) for role in ("reference", "candidate")]
    engines += [("reference", reference), ("candidate", candidate)]
    problems = []
    for role, eng in engines:
        if not isinstance(eng, Mapping):
            continue
        for key in ("command", "binary", "python", "cwd"):
            if eng.get(key) is not None:
                problems.append(FieldProblem(f"{role}.{key}", LOCAL_PROGRAMS))
    if problems:
        raise SpecError(problems, source)
