"""The operator's settings table (docs/operations.md) cannot drift from `Settings`: every field
is a row under its environment variable, with the default the code has, and every row is a
real setting. The README's operator section links the table and names the settings operators
hit first."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gate.core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operations.md"
README = ROOT / "README.md"
ROW = re.compile(r"^\|\s*`(GATE_[A-Z0-9_]+)`\s*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|\s*$")


def env_names() -> dict[str, str]:
    """{GATE_NAME: field name}, the way pydantic-settings reads them (prefix + field name;
    case-insensitive, so upper case as operators write it)."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    out = {}
    for name, field in Settings.model_fields.items():
        assert field.validation_alias is None and field.alias is None, name  # not by name
        out[f"{prefix}{name}".upper()] = name
    return out


def table_rows() -> dict[str, tuple[str, str]]:
    """{GATE_NAME: (default cell, what it does)} of every settings table row of the doc."""
    rows: dict[str, tuple[str, str]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows"
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def documented_default(cell: str) -> str | None:
    """The value a default cell says: `unset`, or a literal in backticks."""
    if cell == "unset":
        return None
    m = re.fullmatch(r"`([^`]*)`", cell)
    assert m, f"a default is `unset` or one literal in backticks, not {cell!r}"
    return m.group(1)


def matches(field: str, literal: str | None) -> bool:
    default = Settings.model_fields[field].get_default(call_default_factory=True)
    if default is None or literal is None:
        return default is None and literal is None
    if isinstance(default, bool):
        return literal == str(default).lower()
    if isinstance(default, int | float):
        return float(literal) == float(default)
    if isinstance(default, list | dict):
        return bool(json.loads(literal) == default)
    return literal == str(default)


def test_every_setting_has_a_row_with_its_default() -> None:
    names, rows = env_names(), table_rows()
    missing = sorted(set(names) - set(rows))
    assert missing == [], f"settings missing from {DOC.name}'s tables: {missing}"
    unknown = sorted(set(rows) - set(names))
    assert unknown == [], f"rows of {DOC.name} that are no setting: {unknown}"
    wrong = [
        (env, cell, Settings.model_fields[names[env]].get_default(call_default_factory=True))
        for env, (cell, _) in rows.items()
        if not matches(names[env], documented_default(cell))
    ]
    assert wrong == [], f"documented defaults that differ from the code's: {wrong}"
    assert all(what for _, what in rows.values()), "every row says what its setting does"


def test_the_check_reads_settings_as_pydantic_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The names built above are the ones the settings are read from."""
    names = env_names()
    monkeypatch.setenv("GATE_LOCAL_GATES", "7")
    monkeypatch.setenv("GATE_PUBLIC_URL", "https://gate.example")
    assert "GATE_LOCAL_GATES" in names and Settings().local_gates == 7
    assert Settings().public_url == "https://gate.example"


def test_the_readme_operator_section_links_the_table() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Run it at scale")
    end = text.find("\n## ", start + 1)  # the README's last section runs to its end
    section = text[start : end if end != -1 else len(text)]
    assert "(docs/operations.md)" in section
    for env in ("GATE_DATA_DIR", "GATE_INVENTORY", "GATE_PUBLIC_URL", "GATE_LOCAL_GATES"):
        assert env in section, env
    assert "What an outage does to running gates" in section
