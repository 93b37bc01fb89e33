"""Turn what a caller sends into a validated GateSpec, allowing only what the operator allowed.

Two kinds of spec reach a gate. The operator's (spec files in GATE_SPEC_DIR, the command line)
are trusted as written. A caller's (REST, `gates:ensure`, Flagger, the CI webhook) is an
allow-list: its engines are templates the operator defined (`{engine: NAME, params: {...}}`,
gate/service/engine_templates.py) or URLs on GATE_ENGINE_URL_ALLOW, a named spec's image may become
another tag of its own repository or one on GATE_IMAGE_ALLOW, and the inventory is the
operator's. Anything else is refused with its field path and the setting that would allow it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gate.access.network import check_allowed
from gate.core.errors import FieldProblem, SpecError, UrlRefused
from gate.core.limits import Limits
from gate.core.settings import Settings
from gate.runs.schedules import plan_problems
from gate.runs.workloads import WorkloadFiles
from gate.service.alerts import notify_problems
from gate.service.engine_templates import EngineTemplate, fill, image_allowed
from gate.spec import (
    NAME_RE,
    GateSpec,
    image_repository,
    load_spec,
    parse_spec,
    spec_limit_problems,
    spec_to_dict,
)

CALLER_ENGINE_KEYS = ("engine", "params", "url", "readiness_timeout_s")
NOT_FROM_A_REQUEST = (
    "a request may not set this; the operator allows engines as templates "
    "(GATE_SPEC_DIR/engines/NAME.yaml or GATE_ENGINES: send `engine: NAME` with its `params`) "
    "or as URLs on GATE_ENGINE_URL_ALLOW (send `url`)"
)
# What a refused engine is replaced by while the rest of the spec is checked: its problems are
# already named, and the spec's own rules should not repeat them in other words.
_STAND_IN = {"url": "http://127.0.0.1"}
# A repository id (`org/name`, `name`), as Hugging Face names models: never a path on the
# worker's host (relative ones resolve against the engine's directory) nor an object-store URI
# (fetched with the host's credentials).
CALLER_MODEL_RE = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
MODEL_NOT_A_PATH = (
    "a request names a model as a repository id (`org/name`), not a path or a URI on the "
    "worker's host; an engine template may pin the weights it serves"
)
INVENTORY_IS_THE_OPERATORS = (
    "a request may not choose the inventory: the operator sets it (GATE_INVENTORY)"
)


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
    """`spec` inline (a caller's, checked against the allow-lists), or `spec_name` from
    settings.spec_dir (the operator's); `reference`/`candidate`, when given, replace the
    spec's engines (as a caller's engines); `reference_image`/`candidate_image` replace only
    the image of a named spec's Kubernetes engine (what a rollout controller knows)."""
    if (spec is None) == (spec_name is None):
        raise SpecError([FieldProblem("spec", "give exactly one of `spec` or `spec_name`")], source)
    callers = _CallerEngines(settings)
    problems: list[FieldProblem] = []
    if spec_name is not None:
        data: dict[str, Any] = spec_to_dict(_named(settings, spec_name, source))
        where = f"spec {spec_name!r}"
    else:
        assert spec is not None
        data, where = _caller_spec(spec, callers, problems), source
    for role, given in (("reference", reference), ("candidate", candidate)):
        if given is not None:
            data[role] = callers.engine(role, given, problems)
    for role, image in (("reference", reference_image), ("candidate", candidate_image)):
        if image is not None:
            _replace_image(settings, data, role, image, named=spec_name is not None, out=problems)
    try:
        parsed = parse_spec(data, where)
    except SpecError as exc:  # every mistake at once: the allow-list's and the spec's
        seen = {p.path for p in problems}
        problems += [p for p in exc.all_problems if not any(a in seen for a in _ancestors(p.path))]
        raise SpecError(problems, where) from None
    problems += notify_problems(parsed, settings)
    problems += spec_limit_problems(parsed, Limits.from_settings(settings))
    if not problems:
        # A caller's files only from the operator's directory (gate/runs/workloads.py).
        files = WorkloadFiles.of(settings, confined=True)
        problems += plan_problems(parsed, Limits.from_settings(settings), files)
    if problems:
        raise SpecError(problems, where)
    return parsed


def _caller_spec(
    spec: Mapping[str, Any], callers: _CallerEngines, problems: list[FieldProblem]
) -> dict[str, Any]:
    """A caller's inline spec: no inventory, a model that is a repository id, engines only
    as the operator's templates or allowed URLs."""
    data = dict(spec)
    if data.get("inventory") is not None:
        problems.append(FieldProblem("inventory", INVENTORY_IS_THE_OPERATORS))
    model = data.get("model")
    if isinstance(model, str) and not CALLER_MODEL_RE.fullmatch(model):
        problems.append(FieldProblem("model", MODEL_NOT_A_PATH))
    for role in ("reference", "candidate"):
        if role in data:
            data[role] = callers.engine(role, data[role], problems)
    return data


def _replace_image(
    settings: Settings,
    data: dict[str, Any],
    role: str,
    image: str,
    *,
    named: bool,
    out: list[FieldProblem],
) -> None:
    """`<role>_image`: another tag of a named spec's Kubernetes image (or an image on
    GATE_IMAGE_ALLOW) in place of the spec's, or a problem saying why not."""
    field = f"{role}_image"
    engine = data.get(role)
    if not named or not isinstance(engine, Mapping):
        out.append(FieldProblem(field, "goes with `spec_name`: it replaces a named spec's image"))
        return
    if not isinstance(engine.get("kubernetes"), Mapping):
        why = f"the spec's {role} is not a kubernetes engine, so it has no image to replace"
        out.append(FieldProblem(field, why))
        return
    own = str(engine["kubernetes"].get("image", ""))
    allow = [image_repository(own), *settings.image_allow]
    if not image_allowed(image, allow):
        out.append(
            FieldProblem(
                field,
                f"repository {image_repository(image)!r} is neither the spec's own "
                f"({image_repository(own)!r}) nor on GATE_IMAGE_ALLOW",
            )
        )
        return
    data[role] = {**engine, "kubernetes": {**engine["kubernetes"], "image": image}}


def _ancestors(path: str) -> list[str]:
    """`a.b[0].c` -> [`a`, `a.b`, `a.b[0]`, `a.b[0].c`]: the paths a problem lies under."""
    out = [path[:i] for i, ch in enumerate(path) if ch in ".[" and i > 0]
    out.append(path)
    return out


class _CallerEngines:
    """A caller's engine made into a spec engine: a template filled in, or an allowed URL."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._templates: dict[str, EngineTemplate] | None = None

    def templates(self) -> dict[str, EngineTemplate]:
        if self._templates is None:
            from gate.service.engine_templates import load_templates

            self._templates = load_templates(self.settings.spec_dir, self.settings.engines)
        return self._templates

    def engine(self, role: str, given: Any, problems: list[FieldProblem]) -> Any:
        if not isinstance(given, Mapping):
            return given  # the spec's own validation names it
        refused = [k for k in given if k not in CALLER_ENGINE_KEYS]
        for key in refused:
            problems.append(FieldProblem(f"{role}.{key}", NOT_FROM_A_REQUEST))
        if refused:
            return dict(_STAND_IN)
        if given.get("engine") is not None:
            return self._template(role, given, problems)
        if "params" in given:
            problems.append(FieldProblem(f"{role}.params", "goes with `engine: NAME`"))
            return dict(_STAND_IN)
        url = given.get("url")
        if isinstance(url, str):
            try:
                clean = check_allowed(url, self.settings.engine_url_allow, loopback=False)
            except UrlRefused as exc:
                problems.append(FieldProblem(f"{role}.url", str(exc)))
                return dict(_STAND_IN)
            return {**given, "url": clean, "caller_url": True}  # checked again on attach
        return given

    def _template(self, role: str, given: Mapping[str, Any], problems: list[FieldProblem]) -> Any:
        name = given["engine"]
        for key in ("url", "readiness_timeout_s"):
            if key in given:
                problems.append(
                    FieldProblem(
                        f"{role}.{key}",
                        "an engine template decides this; send only `engine` and `params`",
                    )
                )
        if not isinstance(name, str):
            problems.append(FieldProblem(f"{role}.engine", "must be a template's name"))
            return dict(_STAND_IN)
        templates = self.templates()
        template = templates.get(name)
        if template is None:
            known = ", ".join(sorted(templates)) or "none are defined"
            problems.append(
                FieldProblem(
                    f"{role}.engine",
                    f"no engine template named {name[:64]!r} (GATE_SPEC_DIR/engines/ or "
                    f"GATE_ENGINES; the templates: {known})",
                )
            )
            return dict(_STAND_IN)
        params = given.get("params") or {}
        if not isinstance(params, Mapping):
            problems.append(FieldProblem(f"{role}.params", "must be a mapping of parameters"))
            return dict(_STAND_IN)
        try:
            return fill(template, params, role)
        except SpecError as exc:
            problems.extend(exc.all_problems)
            return dict(_STAND_IN)


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


def command_line_url_problems(spec: GateSpec, settings: Settings) -> list[FieldProblem]:
    """The command line attaches to loopback and to GATE_ENGINE_URL_ALLOW, nothing else."""
    problems = []
    for role in ("reference", "candidate"):
        url = getattr(spec, role).url
        if url is None:
            continue
        try:
            check_allowed(url, settings.engine_url_allow, loopback=True)
        except UrlRefused as exc:
            problems.append(FieldProblem(f"{role}.url", str(exc)))
    return problems
