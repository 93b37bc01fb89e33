"""The operator's caps: declared once (Caps), read as Limits, set as Settings; the deadlines
they give. A spec against them is tests/gate/spec/test_limits.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from gate.core import limits as limits_module
from gate.core.limits import Caps, Limits, scenario_deadline_s
from gate.core.settings import Settings
from gate.spec import parse_spec

BASE: dict[str, Any] = {
    "name": "t",
    "model": "m",
    "reference": {"url": "http://127.0.0.1:8001"},
    "candidate": {"url": "http://127.0.0.1:8002"},
    "scenarios": [{"name": "steady", "rate": 10, "requests": 300}],
}


def test_settings_carry_every_limit_with_its_default_and_a_description() -> None:
    assert Limits.from_settings(Settings()) == Limits()
    for name in Limits.model_fields:
        assert Settings.model_fields[name].description, name


def test_the_docstring_table_is_true() -> None:
    doc = limits_module.__doc__ or ""
    rows = dict(re.findall(r"^\| (\w+)\s+\|\s+([\d.]+)\s+\|", doc, re.M))
    expected = {name: getattr(Limits(), name) for name in Limits.model_fields}
    assert set(rows) == set(expected)
    for name, value in expected.items():
        assert float(rows[name]) == value, name


def test_deadlines() -> None:
    limits = Limits()
    assert scenario_deadline_s(10.0, limits) == 10.0 * 2 + 300
    assert scenario_deadline_s(None, limits) == 3_600 * 2 + 300
    spec = parse_spec(BASE)
    assert limits.gate_deadline_s(spec) == 3_600
    assert limits.gate_deadline_s(parse_spec(BASE | {"deadline_s": 7_200})) == 7_200
    assert limits.gate_deadline_s(parse_spec(BASE | {"deadline_s": 99_999})) == 14_400


def test_each_cap_is_declared_once() -> None:
    """Settings and Limits both are Caps' fields: settings.py declares no cap of its own."""
    assert set(Limits.model_fields) == set(Caps.model_fields)
    for name, field in Caps.model_fields.items():
        assert Settings.model_fields[name].default == field.default, name
        assert Settings.model_fields[name].description == field.description, name
    settings_py = Path(limits_module.__file__).with_name("settings.py")
    tree = ast.parse(settings_py.read_text())
    declared = {
        node.target.id
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef) and cls.name == "Settings"
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    assert declared.isdisjoint(Caps.model_fields), declared & set(Caps.model_fields)
    assert re.search(r"class Settings\(BaseSettings, Caps\)", settings_py.read_text())
