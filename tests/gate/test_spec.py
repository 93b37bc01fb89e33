from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate.core.errors import SpecError
from gate.spec import load_spec, parse_spec, parse_spec_text

EXAMPLE = """
name: example
model: demo-model
reference:
  command: ["python", "-m", "gate.engines.sim", "--port", "{port}"]
candidate:
  url: "http://127.0.0.1:8001"
scenarios:
  - name: steady
    api: completions          # or chat
    arrival: poisson          # poisson | constant | gamma | concurrency
    rate: 10                  # requests/s; with arrival: concurrency use `concurrency: N`
    requests: 300             # or duration_s
    prompt_tokens: 128
    max_tokens: 32
"""


def test_issue_example_validates_as_written() -> None:
    spec = parse_spec_text(EXAMPLE)
    assert spec.reference.kind == "process"
    assert spec.candidate.kind == "endpoint"
    assert spec.candidate.url == "http://127.0.0.1:8001"
    sc = spec.scenarios[0]
    assert (sc.arrival, sc.rate, sc.requests, sc.prompt_tokens, sc.max_tokens) == (
        "poisson",
        10,
        300,
        128,
        32,
    )
    assert spec.policy.alpha == 0.05


def test_json_is_accepted(tmp_path: Path) -> None:
    import yaml

    p = tmp_path / "spec.json"
    p.write_text(json.dumps(yaml.safe_load(EXAMPLE)))
    assert load_spec(p).name == "example"


def test_three_mistakes_are_all_named() -> None:
    bad = {
        "name": "example",
        "model": "demo-model",
        "reference": {"command": ["python", "-m", "gate.engines.sim"], "url": "http://x:1"},
        "candidate": {"url": "http://127.0.0.1:8001"},
        "scenarios": [
            {"name": "steady", "arrival": "poisson", "rate": -3, "requests": 300},
            {"name": "burst", "arrival": "concurrency", "requests": 10, "max_tokenz": 3},
        ],
    }
    with pytest.raises(SpecError) as info:
        parse_spec(bad)
    paths = {p.path for p in info.value.problems}
    assert "reference" in paths
    assert "scenarios[0].rate" in paths
    assert "scenarios[1].concurrency" in paths
    assert "scenarios[1].max_tokenz" in paths
    msg = info.value.message
    assert "greater than 0" in msg and "unknown field" in msg and "exactly one of" in msg


def test_cross_field_rules() -> None:
    base = yaml_example()
    base["scenarios"][0] = {
        "name": "s",
        "arrival": "poisson",
        "rate": 1,
        "requests": 3,
        "duration_s": 4,
    }
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    assert [p.path for p in info.value.problems] == ["scenarios[0].requests"]


def test_unknown_placeholder_and_empty_command() -> None:
    base = yaml_example()
    base["reference"] = {"command": ["vllm", "serve", "--port", "{prot}"]}
    base["candidate"] = {"command": []}
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    by_path = {p.path: p.message for p in info.value.problems}
    assert "unknown placeholder {prot}" in by_path["reference.command"]
    assert "must not be empty" in by_path["candidate.command"]


def test_duplicate_scenarios_and_bad_names() -> None:
    base = yaml_example()
    base["scenarios"] = [base["scenarios"][0], dict(base["scenarios"][0])]
    with pytest.raises(SpecError, match="repeated: steady"):
        parse_spec(base)
    base = yaml_example()
    base["name"] = "has space"
    with pytest.raises(SpecError, match="name"):
        parse_spec(base)


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "spec.yaml"
    p.write_text("name: x\nscenarios: [\n")
    with pytest.raises(SpecError, match="invalid YAML at line"):
        load_spec(p)


def test_missing_file() -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec("/nonexistent/spec.yaml")


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match="mapping"):
        parse_spec_text("- a\n- b\n")


def test_policy_mistakes_are_named() -> None:
    base = yaml_example()
    base["policy"] = {"alpha": 2, "tolerances": {}}
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path for p in info.value.problems}
    assert "policy.alpha" in paths and "policy.tolerances" in paths


def yaml_example() -> dict:  # type: ignore[type-arg]
    import yaml

    data = yaml.safe_load(EXAMPLE)
    assert isinstance(data, dict)
    return data


def test_engine_presets() -> None:
    base = yaml_example()
    base["reference"] = {
        "preset": "vllm",
        "binary": "/opt/vllm-a/bin/vllm",
        "args": ["--enforce-eager"],
    }
    base["candidate"] = {"preset": "vllm", "binary": "/opt/vllm-b/bin/vllm"}
    spec = parse_spec(base)
    assert spec.reference.kind == "process"
    assert spec.reference.argv_template()[:2] == ["/opt/vllm-a/bin/vllm", "serve"]
    base["candidate"] = {"preset": "vllm", "url": "http://x:1"}
    base["reference"] = {"command": ["x"], "binary": "/y"}
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path: p.message for p in info.value.problems}
    assert "exactly one of" in paths["candidate"]
    assert "go with a `preset`" in paths["reference"]
