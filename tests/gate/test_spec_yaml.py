"""A spec as YAML writes it (issue 30): PyYAML reads YAML 1.1, where a bare `off`, `on`, `yes`
and `no` are booleans, so `correctness: off` (as the README documents it) arrives as False. Every
enum field of a spec that has such a word among its values must take what YAML makes of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from gate.spec import GateSpec, load_spec, spec_to_dict

SPEC = """\
name: yaml-words
model: demo-model
correctness: {value}
reference:
  command: ["python", "-m", "simengine", "--port", "{{port}}"]
candidate:
  command: ["python", "-m", "simengine", "--port", "{{port}}", "--seed", "2"]
scenarios:
  - {{name: steady, rate: 20, requests: 400, prompt_tokens: 16, max_tokens: 8}}
"""

YAML_BOOLEANS = {"y", "yes", "n", "no", "on", "off", "true", "false"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("off", "off"),
        ("Off", "off"),
        ("false", "off"),
        ('"off"', "off"),
        ("auto", "auto"),
        ("on", "auto"),
        ("true", "auto"),
    ],
)
def test_correctness_as_yaml_writes_it(tmp_path: Path, value: str, expected: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(value=value))
    spec = load_spec(path)
    assert spec.correctness == expected
    assert (spec.added_correctness is None) == (expected == "off")
    assert spec_to_dict(spec)["correctness"] == expected  # stored and sent on as the word


def test_correctness_still_refuses_other_words(tmp_path: Path) -> None:
    from gate.core.errors import SpecError

    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(value="sometimes"))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert [p.path for p in err.value.all_problems] == ["correctness"]


def _literals(model: type[BaseModel], path: str, seen: set[type]) -> list[tuple[str, tuple]]:
    """(field path, Literal values) of every Literal field reachable from `model`."""
    if model in seen:
        return []
    seen.add(model)
    out: list[tuple[str, tuple]] = []
    for name, field in model.model_fields.items():
        stack: list[Any] = [field.annotation]
        while stack:
            t = stack.pop()
            origin = get_origin(t)
            if origin is Literal:
                out.append((f"{path}{name}", get_args(t)))
            elif isinstance(t, type) and issubclass(t, BaseModel):
                out += _literals(t, f"{path}{name}.", seen)
            elif origin is not None:  # a union, a list, a dict, an Annotated
                stack.extend(get_args(t))
    return out


def test_every_enum_with_a_yaml_boolean_word_takes_the_boolean() -> None:
    """A guard for the next field: each enum value YAML 1.1 reads as a boolean must be
    accepted as that boolean, field by field. Today that is `correctness` alone."""
    found = [
        (where, value)
        for where, values in _literals(GateSpec, "", set())
        for value in values
        if isinstance(value, str) and value.lower() in YAML_BOOLEANS
    ]
    assert ("correctness", "off") in found
    base = yaml.safe_load(SPEC.format(value="auto"))
    for where, value in found:
        if "." in where:  # a nested enum: name it, so that this test learns to reach it
            raise AssertionError(f"{where}: enum value {value!r} is a YAML boolean; accept it")
        as_yaml = yaml.safe_load(f"v: {value}")["v"]
        assert isinstance(as_yaml, bool)
        spec = GateSpec.model_validate({**base, where: as_yaml})
        assert getattr(spec, where) == value, where
