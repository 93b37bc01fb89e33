"""Caps on what a spec may make the gate spend: each names its field, the value and the cap."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gate.core.limits import Limits
from gate.core.settings import Settings
from gate.spec import limits as limits_module
from gate.spec import load_spec, parse_spec, spec_limit_problems

BASE: dict[str, Any] = {
    "name": "t",
    "model": "m",
    "reference": {"url": "http://127.0.0.1:8001"},
    "candidate": {"url": "http://127.0.0.1:8002"},
    "scenarios": [{"name": "steady", "rate": 10, "requests": 300}],
}


def problems(limits: Limits | None = None, **changes: Any) -> dict[str, str]:
    doc = copy.deepcopy(BASE) | changes
    found = spec_limit_problems(parse_spec(doc), limits or Limits())
    return {p.path: p.message for p in found}


def test_the_issue_example_is_refused_naming_field_value_cap_and_setting() -> None:
    found = spec_limit_problems(
        parse_spec(BASE | {"scenarios": [{"suite": "normal", "requests": 100_000, "rate": 100}]}),
        Limits(),
    )
    assert [str(p) for p in found] == [
        "scenarios[0].requests: 100000 is above the cap of 20000 requests per scenario "
        "(GATE_MAX_SCENARIO_REQUESTS)",
        # the extension the policy may add (extend 0.5) counts toward the gate's total
        "scenarios: 150000 planned requests per arm in all (extensions included) is above "
        "the cap of 100000 requests per gate (GATE_MAX_GATE_REQUESTS)",
    ]


def test_defaults_refuse_nothing_in_the_examples() -> None:
    examples = sorted((Path(__file__).resolve().parents[3] / "examples" / "specs").glob("*.yaml"))
    assert examples
    for path in examples:
        assert spec_limit_problems(load_spec(path), Limits()) == [], path.name
    assert problems() == {}


@pytest.mark.parametrize(
    ("changes", "path", "says"),
    [
        (
            {"scenarios": [{"name": "s", "rate": 50, "duration_s": 1_000}]},
            "scenarios[0].duration_s",
            "1000 s at 50 requests/s plan about 50000 requests, which is above the cap of 20000",
        ),
        (
            {"scenarios": [{"name": "s", "rate": 5, "duration_s": 5_000}]},
            "scenarios[0].duration_s",
            "5000 is above the cap of 3600 seconds per scenario (GATE_MAX_SCENARIO_DURATION_S)",
        ),
        (
            {"scenarios": [{"name": "s", "rate": 1, "requests": 10_000}]},
            "scenarios[0]",
            "9999 s of planned load is above the cap of 3600 seconds per scenario",
        ),
        (
            {"scenarios": [{"name": f"s{i}", "rate": 10, "requests": 10} for i in range(21)]},
            "scenarios",
            "21 scenarios is above the cap of 20 scenarios per gate (GATE_MAX_SCENARIOS)",
        ),
        (
            {"scenarios": [{"name": f"s{i}", "rate": 100, "requests": 15_000} for i in range(6)]},
            "scenarios",
            "135000 planned requests per arm in all (extensions included) is above the cap of "
            "100000 requests per gate (GATE_MAX_GATE_REQUESTS)",
        ),
        (
            {"scenarios": [{"name": "s", "rate": 10, "requests": 30, "prompt_tokens": 100_000}]},
            "scenarios[0].prompt_tokens",
            "100000 is above the cap of 32768 prompt tokens (GATE_MAX_PROMPT_TOKENS)",
        ),
        (
            {"scenarios": [{"name": "s", "rate": 10, "requests": 30, "max_tokens": 100_000}]},
            "scenarios[0].max_tokens",
            "100000 is above the cap of 8192 output tokens (GATE_MAX_OUTPUT_TOKENS)",
        ),
        (
            {"scenarios": [{"suite": "normal", "max_tokens": 50_000}]},
            "scenarios[0].max_tokens",
            "50000 is above the cap of 8192 output tokens",
        ),
        (
            {"scenarios": [{"suite": "correctness", "probes_count": 5_000}]},
            "scenarios[0].probes_count",
            "5000 is above the cap of 256 probes (GATE_MAX_PROBES)",
        ),
        (
            {"scenarios": [{"suite": "correctness", "envelope_load": 4_000}]},
            "scenarios[0].envelope_load",
            "4000 is above the cap of 256 background requests (GATE_MAX_ENVELOPE_LOAD)",
        ),
        (
            {"scenarios": [{"suite": "compatibility", "max_model_len": 1_000_000}]},
            "scenarios[0].max_model_len",
            "1000000 is above the cap of 32768 prompt tokens",
        ),
        (
            {"scenarios": [{"suite": "normal", "max_tokens": 9_000, "requests": 10}]},
            "scenarios[0].max_tokens",
            "9000 is above the cap of 8192 output tokens",
        ),
        (
            {
                "scenarios": [
                    {"name": "s", "arrival": "concurrency", "concurrency": 5_000, "requests": 100}
                ]
            },
            "scenarios[0].concurrency",
            "5000 is above the cap of 1024 requests in flight (GATE_MAX_CONCURRENCY)",
        ),
        (
            {"scenarios": [{"name": "s", "rate": 50_000, "requests": 1_000}]},
            "scenarios[0].rate",
            "50000 is above the cap of 2000 requests/s (GATE_MAX_RATE)",
        ),
        (
            {"scenarios": [{"suite": "overload", "overload_rate": 10_000, "overload_s": 1}]},
            "scenarios[0].overload_rate",
            "10000 is above the cap of 2000 requests/s",
        ),
        (
            {"scenarios": [{"suite": "recovery", "overload_rate": 1_000, "overload_s": 60}]},
            "scenarios[0]",
            "the recovery suite plans about 60401 requests, which is above the cap of 20000",
        ),
        (
            {"shape": {"wait_s": 50_000}},
            "shape.wait_s",
            "50000 is above the cap of 3600 seconds of waiting (GATE_MAX_WAIT_S)",
        ),
        (
            {"candidate": {"url": "http://127.0.0.1:8002", "readiness_timeout_s": 7_000}},
            "candidate.readiness_timeout_s",
            "7000 is above the cap of 3600 seconds to become ready (GATE_MAX_READINESS_TIMEOUT_S)",
        ),
        (
            {"deadline_s": 86_400},
            "deadline_s",
            "86400 is above the cap of 14400 seconds per gate (GATE_MAX_DEADLINE_S)",
        ),
        (
            {"scenarios": [{"name": "s", "rate": 1, "duration_s": 3_000}], "deadline_s": 600},
            "deadline_s",
            "the scenarios plan 3000 s of load, more than the gate deadline of 600 s",
        ),
    ],
)
def test_each_cap_names_its_field(changes: dict[str, Any], path: str, says: str) -> None:
    found = problems(**changes)
    assert path in found, found
    assert says in found[path]


def test_a_closed_loop_for_a_duration_counts_as_the_cap_toward_the_total() -> None:
    loop = {"arrival": "concurrency", "concurrency": 4, "duration_s": 60}
    found = problems(scenarios=[{"name": f"c{i}", **loop} for i in range(6)])
    assert "120000 planned requests per arm" in found["scenarios"]


def test_caps_are_the_operators_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATE_MAX_SCENARIO_REQUESTS", "100")
    monkeypatch.setenv("GATE_MAX_RATE", "5")
    limits = Limits.from_settings(Settings())
    assert (limits.max_scenario_requests, limits.max_rate) == (100, 5.0)
    found = problems(limits)
    assert found == {
        "scenarios[0].requests": "300 is above the cap of 100 requests per scenario "
        "(GATE_MAX_SCENARIO_REQUESTS)",
        "scenarios[0].rate": "10 is above the cap of 5 requests/s (GATE_MAX_RATE)",
    }
    # Raised by the operator, the same spec passes: the caps are not the spec's bounds.
    monkeypatch.setenv("GATE_MAX_SCENARIO_REQUESTS", "200000")
    monkeypatch.setenv("GATE_MAX_GATE_REQUESTS", "500000")
    monkeypatch.delenv("GATE_MAX_RATE")
    roomy = Limits.from_settings(Settings())
    big = {"suite": "normal", "requests": 100_000, "rate": 100}
    assert problems(roomy, scenarios=[big]) == {}


def test_limits_are_checked_by_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    from loadgen import schedule, suite

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("a limit check built a schedule")

    big = [{"suite": "normal", "requests": 100_000}, {"suite": "recovery"}]
    spec = parse_spec(BASE | {"scenarios": big})
    for cls in (suite.Steady, suite.Overload):
        monkeypatch.setattr(cls, "build", boom)
    monkeypatch.setattr(schedule, "build_offsets", boom)
    monkeypatch.setattr(schedule, "build_phased", boom)
    assert "scenarios[0].requests" in {p.path for p in spec_limit_problems(spec, Limits())}


# -- the caps fail closed: a suite knob no cap can read is refused, never let through -----------


def _unchecked_suite(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> Any:
    """A stored suite scenario whose knobs the suite's own checks let through (as if its
    allow-list had a hole): the caps must still hold."""
    from gate.spec import GateSpec, ScenarioSpec
    from loadgen.suite import workloads

    monkeypatch.setattr(workloads, "check_knobs", lambda entry: None)
    spec = parse_spec(BASE)
    sc = ScenarioSpec.model_construct(
        name="a", suite="normal", settings=settings, api="completions"
    )
    return GateSpec.model_construct(**{**dict(spec), "scenarios": [sc]})


def test_caps_refuse_what_they_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _unchecked_suite(
        monkeypatch,
        rate=50.0,
        requests=10,
        max_tokens="1000000",
        extra=[["max_tokens", 10**9], ["n", 64]],
    )
    found = {p.path: p.message for p in spec_limit_problems(spec, Limits())}
    assert "not a value the operator's caps can check" in found["scenarios[0].max_tokens"]
    assert "not a value the operator's caps can check" in found["scenarios[0].extra"]


def test_caps_hold_on_output_and_fan_out_keys_of_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _unchecked_suite(
        monkeypatch,
        rate=50.0,
        requests=10,
        max_tokens=float("nan"),
        extra={"max_tokens": 100_000, "min_tokens": 10**9, "n": 64, "best_of": 4},
    )
    found = {p.path: p.message for p in spec_limit_problems(spec, Limits())}
    assert "not a value the operator's caps can check" in found["scenarios[0].max_tokens"]
    assert "100000 is above the cap of 8192" in found["scenarios[0].extra.max_tokens"]
    assert "above the cap of 8192" in found["scenarios[0].extra.min_tokens"]
    assert "64 completions per request" in found["scenarios[0].extra.n"]
    assert "4 completions per request" in found["scenarios[0].extra.best_of"]


def test_a_length_distribution_is_capped_by_its_maximum() -> None:
    from gate.spec import ScenarioSpec
    from loadgen.prompts import LengthDist

    sc = ScenarioSpec.model_construct(
        name="a",
        suite="normal",
        settings={"requests": 10, "max_tokens": LengthDist("lognormal", 256, 0.6, 1, 50_000)},
        api="completions",
    )
    found = limits_module._scenario_knob_problems("s", sc, Limits())
    assert [p.path for p in found] == ["s.max_tokens"]
    assert "50000 is above the cap of 8192 output tokens" in found[0].message


def test_the_default_correctness_stage_meets_the_operators_caps() -> None:
    """The stage the gate adds to a spec without one (spec.py `added_correctness`) is refused
    like a listed one when the operator's caps are smaller, naming how to leave it out."""
    tight = Limits().model_copy(update={"max_envelope_load": 0, "max_probes": 4})
    found = problems(tight)
    assert set(found) == {"correctness"}
    assert (
        "GATE_MAX_ENVELOPE_LOAD" in found["correctness"]
        or "GATE_MAX_PROBES" in found["correctness"]
    )
    assert "`correctness: off`" in found["correctness"]
    assert problems(tight, correctness="off") == {}
    assert problems() == {}  # the defaults fit the default caps
