"""Engine kinds (gate/spec/kinds.py): one registry that tells, checks and describes each kind;
`kind:` may be written, and a spec without it means what it meant before."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gate.core.errors import SpecError
from gate.spec import ENGINE_KINDS, EngineSpec, parse_spec, spec_to_dict
from gate.spec.kinds import ENGINE_KIND_MESSAGE, kind_of, kind_problem

BASE: dict[str, Any] = {
    "name": "t",
    "model": "m",
    "reference": {"url": "http://127.0.0.1:8001"},
    "candidate": {"url": "http://127.0.0.1:8002"},
    "scenarios": [{"name": "steady", "rate": 10, "requests": 30}],
}
K8S = {"image": "vllm/vllm-openai:v0.11.0", "namespace": "gates", "args": ["--port", "{port}"]}
# one engine of each kind, written without `kind`
EXAMPLES: dict[str, dict[str, Any]] = {
    "command": {"command": ["serve", "--port", "{port}"]},
    "preset": {"preset": "sim", "args": ["--seed", "1"]},
    "url": {"url": "http://127.0.0.1:8002"},
    "kubernetes": {"kubernetes": K8S},
    "groups": {
        "groups": {"prefill": {"preset": "sim"}, "decode": {"preset": "sim"}},
        "router": {"preset": "sim"},
    },
}


def problems(candidate: dict[str, Any]) -> dict[str, str]:
    doc = copy.deepcopy(BASE) | {"candidate": candidate}
    with pytest.raises(SpecError) as info:
        parse_spec(doc)
    return {p.path: p.message for p in info.value.all_problems}


def test_every_kind_is_a_field_of_the_engine_and_has_an_example() -> None:
    assert set(EXAMPLES) == set(ENGINE_KINDS)
    for name, kind in ENGINE_KINDS.items():
        assert kind.name == name and name in EngineSpec.model_fields
        for companion in kind.companions:
            assert companion in EngineSpec.model_fields, (name, companion)
        assert kind.summary in ENGINE_KIND_MESSAGE


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_kind_is_told_by_its_field_or_written(name: str) -> None:
    told = EngineSpec.model_validate(EXAMPLES[name])
    written = EngineSpec.model_validate({"kind": name, **EXAMPLES[name]})
    assert told.kind == written.kind == name == kind_of(EXAMPLES[name])
    assert told == written and told.runtime == ENGINE_KINDS[name].runtime
    assert told.label == written.label == ENGINE_KINDS[name].label(told)
    # never dumped: a spec with or without `kind` is stored, and keyed, the same
    assert "kind" not in written.model_dump() and "kind" not in told.model_dump()


def test_runtimes_and_launching() -> None:
    runtime = {n: (k.runtime, k.launched) for n, k in ENGINE_KINDS.items()}
    assert runtime == {
        "command": ("process", True),
        "preset": ("process", True),
        "url": ("endpoint", False),
        "kubernetes": ("kubernetes", True),
        "groups": ("process", True),
    }


def test_a_spec_written_before_kind_round_trips_unchanged() -> None:
    spec = parse_spec(BASE)
    assert (spec.reference.kind, spec.candidate.kind) == ("url", "url")
    assert spec_to_dict(spec) == BASE
    assert parse_spec(spec_to_dict(spec)) == spec


def test_a_written_kind_must_match_the_field_given() -> None:
    assert problems({"kind": "url"}) == {"candidate": "`kind: url` needs its `url` field"}
    assert problems({"kind": "url", "preset": "sim"}) == {
        "candidate": "`kind: url` is given with `preset`, a field of another kind"
    }
    found = problems({"kind": "image", "url": "http://127.0.0.1:8002"})
    assert list(found) == ["candidate.kind"]


def test_no_kind_or_two_kinds_is_the_one_message() -> None:
    assert problems({}) == {"candidate": ENGINE_KIND_MESSAGE}
    assert problems({"url": "http://127.0.0.1:8002", "preset": "sim"}) == {
        "candidate": ENGINE_KIND_MESSAGE
    }
    assert kind_problem({"kind": ["url"]}) == ENGINE_KIND_MESSAGE  # raw YAML: no crash


def test_companions_go_with_their_kind() -> None:
    assert problems({"url": "http://127.0.0.1:8002", "args": ["-v"]}) == {
        "candidate": "`binary`, `python` and `args` go with a `preset`"
    }
    assert problems({"preset": "sim", "caller_url": True}) == {
        "candidate": "`caller_url` goes with a `url`"
    }
    assert problems({"preset": "sim", "router": {"preset": "sim"}}) == {
        "candidate": "`router` goes with `groups`"
    }
