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


def test_correctness_suite_is_accepted_with_its_knobs() -> None:
    base = yaml_example()
    base["scenarios"].append(
        {"suite": "correctness", "probes_count": 12, "max_tokens": 16, "envelope_load": 4}
    )
    spec = parse_spec(base)
    sc = spec.scenarios[1]
    assert sc.name == "correctness" and sc.is_probe
    assert sc.settings == {"probes_count": 12, "max_tokens": 16, "envelope_load": 4}


def test_correctness_and_peak_knobs_are_validated() -> None:
    base = yaml_example()
    base["scenarios"] = [
        {"suite": "correctness", "top_logprobs": 50},
        {"suite": "correctness", "name": "c2", "probes": 3},
        {"suite": "peak", "slo_ttft_ms": -5},
        {"suite": "peak", "name": "p2", "slo_ttft_ms": 200, "slo_itl_ms": 30},
    ]
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path: p.message for p in info.value.problems}
    assert "top_logprobs must be an integer from 1 to 20" in paths["scenarios[0].settings"]
    assert "probes_count" in paths["scenarios[1].probes"]  # the real knobs are named
    assert "slo_ttft_ms must be a positive number" in paths["scenarios[2].settings"]
    assert not any(p.startswith("scenarios[3]") for p in paths)


# -- kubernetes engines ------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "specs"


def kube_engine(**kw: object) -> dict:  # type: ignore[type-arg]
    return {
        "image": "vllm/vllm-openai:v0.11.0",
        "namespace": "llm-gate",
        "args": ["--model", "{model}", "--port", "{port}", "--tensor-parallel-size", "{tp}"],
        **kw,
    }


def test_kubernetes_example_validates() -> None:
    spec = load_spec(EXAMPLES / "kubernetes.yaml")
    ref, cand = spec.reference, spec.candidate
    assert (ref.kind, cand.kind) == ("kubernetes", "kubernetes")
    assert ref.kubernetes is not None and cand.kubernetes is not None
    assert (ref.label, cand.label) == ("vllm/vllm-openai:v0.10.2", "vllm/vllm-openai:v0.11.0")
    # The two engines differ by image only.
    assert ref.kubernetes.model_dump(exclude={"image"}) == cand.kubernetes.model_dump(
        exclude={"image"}
    )
    assert ref.kubernetes.command == ["vllm", "serve", "{model}"]
    assert "{tp}" in ref.kubernetes.args and ref.kubernetes.secret_env["HF_TOKEN"].secret
    assert (spec.shape.sku, spec.shape.gpus_per_engine, spec.shape.together) == ("H200", 8, "block")
    assert ref.readiness_timeout_s == 1800


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:v0.11.0",
        "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3",
        "lmsysorg/sglang:v0.5.3-cu129",
        "localhost:5000/team/vllm@sha256:" + "a" * 64,
        "registry.example.com:443/a/b:c@sha256:" + "0" * 64,
    ],
)
def test_kubernetes_image_references_with_a_tag_or_digest_pass(image: str) -> None:
    base = yaml_example()
    base["reference"] = base["candidate"] = {"kubernetes": kube_engine(image=image)}
    assert parse_spec(base).candidate.label == image


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("vllm/vllm-openai", "give a tag or a digest"),
        ("vllm/vllm-openai:", "not an image reference"),
        ("vllm/VLLM-openai:v1", "not an image reference"),
        ("vllm/vllm-openai:v1 --debug", "not an image reference"),
        ("vllm/vllm-openai@sha256:abc", "not an image reference"),
    ],
)
def test_kubernetes_image_reference_mistakes_are_named(image: str, says: str) -> None:
    base = yaml_example()
    base["reference"] = base["candidate"] = {"kubernetes": kube_engine(image=image)}
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path: p.message for p in info.value.problems}
    assert says in paths["candidate.kubernetes.image"]
    assert says in paths["reference.kubernetes.image"]


def test_kubernetes_engine_mistakes_are_each_named_by_field() -> None:
    base = yaml_example()
    base["reference"] = {
        "kubernetes": kube_engine(
            namespace="LLM_Gate",
            command=["sh", "-c", "vllm serve {model}"],
            env={"1BAD": "x"},
            memory="lots",
            port=0,
        )
    }
    base["candidate"] = {
        "kubernetes": kube_engine(
            args=["--model", "{weights}"],
            secret_env={"HF_TOKEN": {"secret": "HF Token", "key": "token"}},
            image_pull_policy="Sometimes",
        )
    }
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path: p.message for p in info.value.problems}
    assert "DNS-1123 label" in paths["reference.kubernetes.namespace"]
    assert "never a shell string" in paths["reference.kubernetes.command"]
    assert "'1BAD' is not a valid environment variable name" in paths["reference.kubernetes.env"]
    assert "not a Kubernetes quantity" in paths["reference.kubernetes.memory"]
    assert "reference.kubernetes.port" in paths
    assert "unknown placeholder {weights}" in paths["candidate.kubernetes.args"]
    assert "Secret name" in paths["candidate.kubernetes.secret_env.HF_TOKEN.secret"]
    assert "candidate.kubernetes.image_pull_policy" in paths
    assert len(paths) == 8


def test_kubernetes_engine_rules_across_fields() -> None:
    base = yaml_example()
    cases = [
        ({"command": ["sh"], "args": ["-c", "vllm serve x"]}, "never a shell string"),
        ({"args": ["vllm serve --model x"], "command": []}, "looks like a command line"),
        ({"args": [], "command": []}, "give `command` and/or `args`"),
        ({"in_cluster": True, "kubeconfig": "/k"}, "not both"),
    ]
    for extra, says in cases:
        base["reference"] = base["candidate"] = {"kubernetes": kube_engine(**extra)}
        with pytest.raises(SpecError) as info:
            parse_spec(base)
        paths = {p.path: p.message for p in info.value.problems}
        assert says in paths["candidate.kubernetes"], (extra, paths)
    # Local-process fields do not go with a kubernetes engine; its env goes inside it.
    base["reference"] = base["candidate"] = {"kubernetes": kube_engine(), "env": {"A": "b"}}
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    assert (
        "goes in `kubernetes.env`" in {p.path: p.message for p in info.value.problems}["reference"]
    )


def test_kubernetes_engines_pair_with_each_other_on_one_cluster() -> None:
    base = yaml_example()
    base["reference"] = {"kubernetes": kube_engine(kubeconfig="/a")}
    base["candidate"] = {"command": ["python", "-m", "gate.engines.sim", "--port", "{port}"]}
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path: p.message for p in info.value.problems}
    assert "not with a local process" in paths["candidate"]

    base["candidate"] = {"kubernetes": kube_engine(kubeconfig="/b")}
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path: p.message for p in info.value.problems}
    assert "must be on one cluster" in paths["candidate.kubernetes"]

    base["candidate"] = {"url": "http://127.0.0.1:8001"}  # attached elsewhere: allowed
    spec = parse_spec(base)
    assert (spec.reference.kind, spec.candidate.kind) == ("kubernetes", "endpoint")


@pytest.mark.parametrize(
    "path",
    sorted(Path(__file__).resolve().parents[2].glob("examples/specs/*.yaml")),
    ids=lambda p: p.name,
)
def test_every_example_spec_loads(path: Path) -> None:
    assert load_spec(path).scenarios


def test_spec_validation_does_not_build_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller's `{suite: normal, requests: 100000}` is validated by arithmetic (suite.plan):
    building it took 6 s inside the POST that sent it. Every builder raises here, so validation
    that built anything would fail."""
    import time

    from loadgen import prompts, schedule, suite

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("spec validation built a schedule")

    for cls in (suite.Steady, suite.Overload, suite.Compatibility, suite.Correctness):
        monkeypatch.setattr(cls, "build", boom)
    for module in (suite, schedule):
        monkeypatch.setattr(module, "build_offsets", boom)
        monkeypatch.setattr(module, "build_phased", boom)
    for module in (suite, prompts):
        monkeypatch.setattr(module, "synthetic_prompts", boom)
    base = yaml_example()
    base["scenarios"] = [
        {"suite": "normal", "requests": 100_000},
        {"suite": "peak", "duration_s": 3_000, "rate": 30},
        {"suite": "recovery", "overload_rate": 500, "overload_s": 60},
        {"suite": "compatibility", "max_model_len": 100_000},
        {"suite": "correctness", "probes_count": 10_000},
    ]
    t0 = time.perf_counter()
    spec = parse_spec(base)
    assert time.perf_counter() - t0 < 1.0
    assert spec.scenarios[0].settings == {"requests": 100_000}
    # Bad knobs are still named as building them would have named them.
    base["scenarios"] = [
        {"suite": "normal", "rate": -2},
        {"suite": "overload", "name": "o", "before_s": 0},
        {"suite": "normal", "name": "n2", "requests": 400, "prompt_tokens": 1},
    ]
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    paths = {p.path: p.message for p in info.value.problems}
    assert paths["scenarios[0].settings"] == (
        "suite normal rejects these settings: rate: must be a finite number > 0, got -2"
    )
    assert "duration_s: must be a finite number > 0" in paths["scenarios[1].settings"]
    assert "400 distinct prompts of 1 words" in paths["scenarios[2].settings"]
