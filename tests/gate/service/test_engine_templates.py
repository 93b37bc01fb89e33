"""Engine templates: a caller fills the operator's declared parameters and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gate.core.errors import SpecError
from gate.service.engine_templates import (
    EngineTemplate,
    fill,
    image_allowed,
    image_repository,
    load_templates,
)
from gate.spec import EngineSpec

VLLM: dict[str, Any] = {
    "engine": {
        "preset": "vllm",
        "binary": "{build}",
        "args": ["--max-model-len", "{max_len}", "{flags}"],
    },
    "params": {
        "build": {
            "type": "choice",
            "choices": {"0.10.2": "/opt/vllm-0.10.2/bin/vllm", "0.11.0": "/opt/vllm-0.11/bin/vllm"},
        },
        "max_len": {"type": "int", "min": 256, "max": 131072, "default": 8192},
        "flags": {
            "type": "choice",
            "choices": {"none": [], "eager": ["--enforce-eager"]},
            "default": "none",
        },
    },
}
K8S: dict[str, Any] = {
    "engine": {
        "kubernetes": {
            "image": "{image}",
            "namespace": "gates",
            "args": ["--model", "{model}", "--port", "{port}"],
            "service_account": "gate-engine",
        }
    },
    "params": {"image": {"type": "image", "allow": ["ghcr.io/acme/vllm"]}},
}


def test_a_filled_template_is_the_operators_engine_with_the_callers_choices() -> None:
    engine = fill(EngineTemplate.model_validate(VLLM), {"build": "0.11.0", "flags": "eager"}, "c")
    spec = EngineSpec.model_validate(engine)
    assert spec.binary == "/opt/vllm-0.11/bin/vllm"
    assert spec.args == ["--max-model-len", "8192", "--enforce-eager"]  # list choice spliced
    argv = spec.argv_template()
    assert "{port}" in argv and "{model}" in argv  # the gate's own placeholders stay


def test_an_empty_list_choice_leaves_no_item() -> None:
    engine = fill(EngineTemplate.model_validate(VLLM), {"build": "0.10.2"}, "c")
    assert engine["args"] == ["--max-model-len", "8192"]


@pytest.mark.parametrize(
    ("params", "path", "words"),
    [
        ({"build": "/bin/sh"}, "c.params.build", "one of"),
        ({"build": "0.11.0", "max_len": 10**9}, "c.params.max_len", "between 256 and 131072"),
        ({"build": "0.11.0", "max_len": "8192; rm -rf /"}, "c.params.max_len", "integer"),
        ({"build": "0.11.0", "max_len": True}, "c.params.max_len", "integer"),
        ({"build": "0.11.0", "env": {"LD_PRELOAD": "x"}}, "c.params.env", "not a parameter"),
        ({}, "c.params.build", "required"),
    ],
)
def test_parameters_outside_the_declaration_are_refused_by_path(
    params: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        fill(EngineTemplate.model_validate(VLLM), params, "c")
    problems = {p.path: p.message for p in err.value.problems}
    assert path in problems and words in problems[path], problems


def test_image_parameter_stays_in_its_repositories() -> None:
    template = EngineTemplate.model_validate(K8S)
    ok = fill(template, {"image": "ghcr.io/acme/vllm:v0.11.1"}, "candidate")
    assert ok["kubernetes"]["image"] == "ghcr.io/acme/vllm:v0.11.1"
    assert ok["kubernetes"]["service_account"] == "gate-engine"  # the operator's, not the caller's
    for bad in ("ghcr.io/acme/vllm-evil:v1", "ghcr.io/evil/vllm:v1", "ghcr.io/acme/vllm"):
        with pytest.raises(SpecError):
            fill(template, {"image": bad}, "candidate")


def test_string_parameters_match_in_full_and_never_read_as_options() -> None:
    template = EngineTemplate.model_validate(
        {
            "engine": {"command": ["serve", "--tag", "{tag}", "--port", "{port}"]},
            "params": {"tag": {"type": "string", "pattern": "[a-z0-9-]+"}},
        }
    )
    assert fill(template, {"tag": "ok-1"}, "r")["command"][2] == "ok-1"
    for bad in ("--truth-log=/etc/passwd", "ok\nx", "a b", "x" * 101):
        with pytest.raises(SpecError):
            fill(template, {"tag": bad}, "r")


def test_templates_may_not_redefine_the_gates_placeholders() -> None:
    with pytest.raises(ValueError, match="gate's own placeholders"):
        EngineTemplate.model_validate(
            {"engine": {"command": ["x"]}, "params": {"port": {"type": "int", "min": 1, "max": 2}}}
        )


def test_templates_load_from_the_spec_dir_and_settings_and_are_checked(tmp_path: Path) -> None:
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "vllm.yaml").write_text(yaml.safe_dump(VLLM))
    loaded = load_templates(tmp_path, {"k8s": K8S})
    assert sorted(loaded) == ["k8s", "vllm"]
    with pytest.raises(SpecError, match="defined twice"):
        load_templates(tmp_path, {"vllm": K8S})
    broken = {"engine": {"command": ["serve", "--port", "{prot}"]}}  # a misspelt placeholder
    (tmp_path / "engines" / "broken.yaml").write_text(yaml.safe_dump(broken))
    with pytest.raises(SpecError) as err:
        load_templates(tmp_path, {})
    assert "broken.yaml" in err.value.message


@given(
    head=st.sampled_from(["ghcr.io/acme", "registry.local:5000/team", "docker.io/library"]),
    name=st.from_regex(r"[a-z0-9]{1,12}", fullmatch=True),
    tail=st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True),
    tag=st.from_regex(r"v[0-9]{1,3}\.[0-9]{1,3}", fullmatch=True),
)
def test_image_prefixes_match_whole_path_segments(
    head: str, name: str, tail: str, tag: str
) -> None:
    image = f"{head}/{name}{tail}:{tag}"
    assert image_repository(image) == f"{head}/{name}{tail}"
    assert image_allowed(image, [f"{head}/"])
    assert image_allowed(image, [f"{head}/{name}{tail}"])
    assert not image_allowed(image, [f"{head}/{name}"])  # a prefix of the name is not a segment
    assert not image_allowed(image, [head])  # an exact entry is the repository itself


def test_the_example_templates_load_and_fill() -> None:
    root = Path(__file__).resolve().parents[3] / "examples" / "specs"
    templates = load_templates(root, {})
    sim = EngineSpec.model_validate(fill(templates["sim"], {"ttft_ms": 60}, "candidate"))
    assert sim.preset == "sim" and sim.args[:2] == ["--ttft-ms", "60"]
    k8s = fill(templates["vllm-k8s"], {"image": "vllm/vllm-openai:v0.11.1"}, "candidate")
    assert EngineSpec.model_validate(k8s).kubernetes is not None
    with pytest.raises(SpecError):
        fill(templates["vllm-k8s"], {"image": "docker.io/evil/vllm-openai:v1"}, "candidate")


def test_values_are_checked_as_assembled_too() -> None:
    """`.` and `.` are each fine; side by side in one path they are `..`."""
    template = EngineTemplate.model_validate(
        {
            "engine": {"preset": "vllm", "binary": "/opt/venvs/{a}{b}/bin/vllm"},
            "params": {
                "a": {"type": "string", "pattern": "[a-z0-9.]+"},
                "b": {"type": "string", "pattern": "[a-z0-9.]+"},
            },
        }
    )
    assert fill(template, {"a": "v0", "b": ".11"}, "c")["binary"] == "/opt/venvs/v0.11/bin/vllm"
    with pytest.raises(SpecError, match=r"'\.\.'"):
        fill(template, {"a": ".", "b": "."}, "c")


def test_an_image_with_a_trailing_newline_is_not_an_image() -> None:
    from gate.spec import check_image

    with pytest.raises(ValueError):
        check_image("vllm/vllm-openai:v0.11.1\n")
