"""Engine templates: the engines an API caller may ask for, as the operator wrote them.

A request to the service (REST, `gates:ensure`, Flagger, the CI webhook) never says what to run
on a GPU host: it names a template and fills the template's declared parameters, each of a
declared type with declared bounds. Everything else of the engine (its program, environment,
working directory, namespace, service account, secrets) is the operator's.

```yaml
# GATE_SPEC_DIR/engines/vllm-venv.yaml (or one entry of GATE_ENGINES)
description: vLLM from one of this host's virtual environments
engine:                                   # an engine of a gate spec, trusted as written
  preset: vllm
  binary: "{build}"
  args: ["--max-model-len", "{max_model_len}"]
params:
  build:
    type: choice
    choices: {"0.10.2": /opt/vllm-0.10.2/bin/vllm, "0.11.0": /opt/vllm-0.11.0/bin/vllm}
  max_model_len: {type: int, min: 256, max: 131072, default: 8192}
```

A caller then sends `candidate: {engine: vllm-venv, params: {build: "0.11.0"}}`.

Parameters fill `{name}` in the string values of the engine; a list-valued choice that is a
whole item of an argv list is spliced into it (`"{flags}"` -> `["--enforce-eager"]` or `[]`).
Nothing else is substituted: no format(), no shell, ever (see `render_argv`). Names of the
gate's own placeholders (`{port}`, `{model}`, ...) are not parameters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gate.core.errors import FieldProblem, SpecError
from gate.spec import EngineSpec, check_image, image_repository

PARAM_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
TEMPLATE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
RESERVED = frozenset({"port", "host", "model", "gpus", "tp", "nodes", "total_gpus"})
MAX_TEMPLATE_BYTES = 200_000
MAX_STRING_PARAM = 200


class _Param(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str = ""


class IntParam(_Param):
    type: Literal["int"]
    min: int
    max: int
    default: int | None = None

    def check(self, value: Any) -> tuple[str | list[str] | None, str | None]:
        if isinstance(value, bool) or not isinstance(value, int):
            return None, "must be an integer"
        if not self.min <= value <= self.max:
            return None, f"must be between {self.min} and {self.max}, got {value}"
        return str(value), None


class NumberParam(_Param):
    type: Literal["number"]
    min: float
    max: float
    default: float | None = None

    def check(self, value: Any) -> tuple[str | list[str] | None, str | None]:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, "must be a number"
        if not self.min <= value <= self.max or not math.isfinite(value):  # bounds first: a
            # 400-digit int compares fine but overflows isfinite's float
            return None, f"must be between {self.min:g} and {self.max:g}, got {str(value)[:40]}"
        return repr(float(value)) if isinstance(value, float) else str(value), None


class StringParam(_Param):
    """A string matching the operator's pattern in full (the pattern is the allow-list)."""

    type: Literal["string"]
    pattern: str = Field(description="a regular expression the whole value must match")
    max_length: int = Field(default=100, ge=1, le=MAX_STRING_PARAM)
    default: str | None = None

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return v

    def check(self, value: Any) -> tuple[str | list[str] | None, str | None]:
        if not isinstance(value, str):
            return None, "must be a string"
        if len(value) > self.max_length:
            return None, f"is {len(value)} characters; at most {self.max_length}"
        if value.startswith("-"):
            return None, "must not start with '-' (it would read as an option)"
        if any(ch in value for ch in "{}$\\") or ".." in value or not value.isprintable():
            return None, (
                "must not contain '{', '}', '$', '\\', '..' or control characters (they would be "
                "read again as placeholders, variables or paths)"
            )
        if re.fullmatch(self.pattern, value) is None:
            return None, f"must match {self.pattern}"
        return value, None


class ChoiceParam(_Param):
    """One of the operator's labels; the value put in is the label's (a string or an argv
    list), so a caller picks among things the operator wrote and writes none of them."""

    type: Literal["choice"]
    choices: dict[str, str | list[str]] = Field(min_length=1)
    default: str | None = None

    def check(self, value: Any) -> tuple[str | list[str] | None, str | None]:
        if not isinstance(value, str) or value not in self.choices:
            return None, "must be one of " + ", ".join(repr(c) for c in self.choices)
        chosen = self.choices[value]
        return (list(chosen) if isinstance(chosen, list) else chosen), None


class ImageParam(_Param):
    """An image reference under one of the operator's repository prefixes, pinned by a tag
    or a digest (`ghcr.io/acme/vllm` allows `ghcr.io/acme/vllm:v2`, never
    `ghcr.io/acme/vllm-evil:v2`)."""

    type: Literal["image"]
    allow: list[str] = Field(min_length=1, description="repository prefixes, e.g. ghcr.io/acme/")
    default: str | None = None

    def check(self, value: Any) -> tuple[str | list[str] | None, str | None]:
        if not isinstance(value, str):
            return None, "must be an image reference"
        try:
            check_image(value)
        except ValueError as exc:
            return None, str(exc)
        if not image_allowed(value, self.allow):
            return None, "is not under the template's allowed repositories: " + ", ".join(
                self.allow
            )
        return value, None


Param = Annotated[
    IntParam | NumberParam | StringParam | ChoiceParam | ImageParam, Field(discriminator="type")
]


def image_allowed(image: str, allow: list[str]) -> bool:
    """An image is allowed when its repository is an entry, or lies under an entry that ends
    with '/': whole path segments, so a prefix never matches a longer repository name."""
    repo = image_repository(image)
    for entry in allow:
        entry = entry.strip()
        if not entry:
            continue
        if entry.endswith("/"):
            if repo.startswith(entry):
                return True
        elif repo == entry:
            return True
    return False


class EngineTemplate(BaseModel):
    """One operator-defined engine and the parameters a caller may fill."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str = ""
    engine: dict[str, Any]
    params: dict[str, Param] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not PARAM_NAME_RE.match(name):
                raise ValueError(f"{name!r}: use 1-40 lower-case letters, digits or '_'")
            if name in RESERVED:
                raise ValueError(f"{name!r} is one of the gate's own placeholders")
        return v


def fill(template: EngineTemplate, given: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The engine mapping with the caller's parameters put in; every mistake named by its
    path (`candidate.params.build`), every unknown parameter refused."""
    problems = [
        FieldProblem(
            f"{path}.params.{name}",
            "not a parameter of this engine"
            + (f" (its parameters: {', '.join(template.params)})" if template.params else ""),
        )
        for name in given
        if name not in template.params
    ]
    values: dict[str, str | list[str]] = {}
    for name, param in template.params.items():
        raw = given.get(name, param.default)
        if raw is None:
            problems.append(FieldProblem(f"{path}.params.{name}", "required parameter is missing"))
            continue
        value, problem = param.check(raw)
        if problem is not None:
            problems.append(FieldProblem(f"{path}.params.{name}", problem))
        elif value is not None:
            values[name] = value
    if problems:
        raise SpecError(problems, "request")
    try:
        filled = _substitute(template.engine, values)
    except ValueError as exc:
        raise SpecError([FieldProblem(f"{path}.params", str(exc))], "request") from None
    assert isinstance(filled, dict)
    if values and (bad := _assembled_problem(filled, template.engine)) is not None:
        raise SpecError([FieldProblem(f"{path}.params", bad)], "request")
    return filled


def _assembled_problem(filled: Any, written: Any) -> str | None:
    """Values are checked one by one; two of them side by side (`{a}{b}` with `.` and `.`)
    could still make a `..` segment or a `$(`: every string a parameter went into is checked
    as assembled."""
    if isinstance(filled, dict):
        for k, v in filled.items():
            if (
                bad := _assembled_problem(v, written.get(k) if isinstance(written, dict) else None)
            ) is not None:
                return bad
        return None
    if isinstance(filled, list):
        for v in filled:
            if (bad := _assembled_problem(v, None)) is not None:
                return bad
        return None
    segments = filled.replace("\\", "/").split("/") if isinstance(filled, str) else []
    if filled != written and (".." in segments or "$(" in str(filled)):
        return f"together the parameters make {str(filled)[:80]!r}, which has a '..' or '$('"
    return None


_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")


def _substitute(node: Any, values: Mapping[str, str | list[str]]) -> Any:
    if isinstance(node, dict):
        return {k: _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        out: list[Any] = []
        for item in node:
            m = _PLACEHOLDER.fullmatch(item) if isinstance(item, str) else None
            if m and isinstance(values.get(m.group(1)), list):
                out.extend(values[m.group(1)])  # a list choice spliced into an argv
            else:
                out.append(_substitute(item, values))
        return out
    if isinstance(node, str):

        def put(m: re.Match[str]) -> str:
            value = values.get(m.group(1))
            if value is None:
                return m.group(0)  # the gate's own placeholder, filled at launch
            if isinstance(value, list):
                raise ValueError(f"parameter {m.group(1)!r} is a list; use it as a whole item")
            return value

        return _PLACEHOLDER.sub(put, node)
    return node


def load_templates(spec_dir: Path | None, inline: Mapping[str, Any]) -> dict[str, EngineTemplate]:
    """Templates from `GATE_SPEC_DIR/engines/NAME.yaml` and from settings (`GATE_ENGINES`);
    each is checked by filling it with its defaults (or a first valid value) and validating
    the engine, so a broken template is an operator's error at load, not a caller's."""
    raw: dict[str, tuple[str, Any]] = {}
    if spec_dir is not None and (spec_dir / "engines").is_dir():
        for path in sorted((spec_dir / "engines").iterdir()):
            if path.suffix.lower() not in (".yaml", ".yml", ".json") or not path.is_file():
                continue
            if path.stat().st_size > MAX_TEMPLATE_BYTES:
                raise SpecError(
                    [FieldProblem("(file)", f"larger than {MAX_TEMPLATE_BYTES} bytes")], str(path)
                )
            try:
                raw[path.stem] = (str(path), yaml.safe_load(path.read_text(encoding="utf-8")))
            except yaml.YAMLError as exc:
                raise SpecError(
                    [FieldProblem("(file)", f"invalid YAML: {exc}")], str(path)
                ) from None
    for name, doc in inline.items():
        if name in raw:
            raise SpecError(
                [FieldProblem(name, f"defined twice: in GATE_ENGINES and {raw[name][0]}")],
                "GATE_ENGINES",
            )
        raw[name] = (f"GATE_ENGINES[{name}]", doc)
    out: dict[str, EngineTemplate] = {}
    for name, (where, doc) in raw.items():
        if not TEMPLATE_NAME_RE.match(name):
            raise SpecError(
                [FieldProblem("(name)", "use 1-63 letters, digits, '.', '_', '-'")], where
            )
        try:
            template = EngineTemplate.model_validate(doc)
        except ValidationError as exc:
            raise SpecError(
                [
                    FieldProblem(".".join(str(p) for p in e["loc"]) or "(template)", e["msg"])
                    for e in exc.errors()
                ],
                where,
            ) from None
        _check_template(template, where)
        out[name] = template
    return out


def _check_template(template: EngineTemplate, where: str) -> None:
    """Fill with a sample of every parameter, then once more per further choice of each
    choice parameter: every value a caller can pick must make a valid engine."""
    _check_sample(template, where, {})
    for name, param in template.params.items():
        if isinstance(param, ChoiceParam):
            for label in param.choices:
                _check_sample(template, where, {name: label})


def _check_sample(template: EngineTemplate, where: str, pick: Mapping[str, Any]) -> None:
    sample: dict[str, Any] = dict(pick)
    for name, param in template.params.items():
        if name in sample:
            continue
        if param.default is not None:
            sample[name] = param.default
        elif isinstance(param, ChoiceParam):
            sample[name] = next(iter(param.choices))
        elif isinstance(param, IntParam | NumberParam):
            sample[name] = param.min
        elif isinstance(param, ImageParam):
            entry = param.allow[0].strip()
            sample[name] = (entry + "sample" if entry.endswith("/") else entry) + ":v0"
    missing = [n for n in template.params if n not in sample]
    try:
        filled = _substitute(
            template.engine,
            {
                **{n: "x" for n in missing},
                **{k: v for k, v in _checked(template, sample, where).items()},
            },
        )
        EngineSpec.model_validate(filled)
    except ValidationError as exc:
        raise SpecError(
            [
                FieldProblem("engine." + ".".join(str(p) for p in e["loc"]), e["msg"])
                for e in exc.errors()
            ],
            where,
        ) from None
    except ValueError as exc:
        raise SpecError([FieldProblem("engine", str(exc))], where) from None


def _checked(
    template: EngineTemplate, sample: Mapping[str, Any], where: str
) -> dict[str, str | list[str]]:
    out: dict[str, str | list[str]] = {}
    for name, value in sample.items():
        filled, problem = template.params[name].check(value)
        if problem is not None:
            raise SpecError([FieldProblem(f"params.{name}.default", problem)], where)
        if filled is not None:
            out[name] = filled
    return out
