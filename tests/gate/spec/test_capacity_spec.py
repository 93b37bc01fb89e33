"""A capacity scenario in a spec (issue 33): its knobs refused by field path, its rates and its
planned size held to the operator's caps before it runs, no schedule planned for it (a search
has none), and its search read back from the stored document for re-judge."""

from __future__ import annotations

from typing import Any

import pytest

from gate.core.errors import SpecError
from gate.core.limits import Limits
from gate.runs.inputs import judge_gate, judge_inputs
from gate.runs.schedules import plan_gate
from gate.spec import parse_spec, spec_limit_problems
from gate.verdict.document import CapacityDoc
from loadgen import suite

BASE: dict[str, Any] = {
    "name": "cap",
    "model": "m",
    "reference": {"url": "http://127.0.0.1:1"},
    "candidate": {"url": "http://127.0.0.1:2"},
    "correctness": "off",
}
STEADY = {"name": "steady", "rate": 20, "requests": 400}


def problems(scenario: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_spec(BASE | {"scenarios": [scenario]})
    return [(p.path, p.message) for p in err.value.all_problems]


@pytest.mark.parametrize(
    ("scenario", "path", "words"),
    [
        ({"suite": "capacity", "slo": {"ttft": 1}}, "scenarios[0].slo.ttft", "not an objective"),
        ({"suite": "capacity", "goodput": 2}, "scenarios[0].goodput", "at most 1"),
        ({"suite": "capacity", "growth": 1}, "scenarios[0].growth", "> 1"),
        (
            {"suite": "capacity", "start_rate": 50, "max_rate": 10},
            "scenarios[0].max_rate",
            "at least start_rate",
        ),
        ({"suite": "capacity", "rate": 10}, "scenarios[0].rate", "not a setting of suite capacity"),
    ],
)
def test_knobs_are_refused_by_field(scenario: dict[str, Any], path: str, words: str) -> None:
    got = problems(scenario)
    assert got and got[0][0] == path and words in got[0][1], got


def test_the_search_is_sized_and_capped_before_it_runs() -> None:
    spec = parse_spec(
        BASE | {"scenarios": [STEADY, {"suite": "capacity", "max_rate": 5000, "step_s": 600}]}
    )
    found = [(p.path, p.message) for p in spec_limit_problems(spec, Limits())]
    said = " | ".join(f"{path}: {msg}" for path, msg in found)
    assert "scenarios[1].max_rate: 5000 is above the cap" in said and "GATE_MAX_RATE" in said
    assert "scenarios[1]: the capacity suite plans about" in said
    assert "seconds per scenario" in said
    # The defaults fit the default caps: a search of 23 steps of 5 s
    default = parse_spec(BASE | {"scenarios": [STEADY, {"suite": "capacity"}]})
    assert spec_limit_problems(default, Limits()) == []
    entry = suite.get("capacity")
    assert isinstance(entry, suite.Capacity) and entry.max_steps() == 23


def test_no_schedule_or_look_is_planned_for_a_search() -> None:
    spec = parse_spec(BASE | {"scenarios": [STEADY, {"suite": "capacity"}]})
    gplan = plan_gate(spec, Limits())
    assert set(gplan.schedules) == {"steady"}
    assert gplan.plan is not None and set(gplan.plan.requests) == {"steady"}


def _engine(goodput: float) -> dict[str, Any]:
    n = 100
    return {"sent": n, "good": round(goodput * n), "goodput": goodput, "ttft_p50_ms": 40.0}


def test_the_stored_search_is_judged_again_as_the_run_judged_it() -> None:
    spec = parse_spec(BASE | {"scenarios": [STEADY, {"suite": "capacity", "name": "cap"}]})
    steps = [(41.7, 1, 1), (42.8, 1, 0.7), (48.6, 1, 0.5), (50.0, 0.6, 0.4)]
    doc = CapacityDoc.model_validate(
        {
            "name": "cap",
            "target": 0.95,
            "slo": "TTFT <= 1000 ms",
            "resolution": 0.03,
            "duration_s": 30.0,
            "stopped": "done",
            "steps": [
                {"rate": r, "stage": "bisect", "reference": _engine(a), "candidate": _engine(b)}
                for r, a, b in steps
            ],
        }
    )
    again = CapacityDoc.model_validate(doc.to_json())  # as stored and read back
    found = judge_inputs({"cap": spec.scenarios[1]}, [], {}, None, 8, capacity=[again])
    verdict = judge_gate(found, spec.policy)
    check = next(c for c in verdict.checks if c.id == "cap.capacity")
    assert check.decision == "fail" and check in verdict.reasons
    # A search of a scenario the spec no longer names is not judged
    assert judge_inputs({}, [], {}, None, 8, capacity=[again]).capacity == ()


def test_a_search_without_a_load_scenario_is_refused_before_it_runs() -> None:
    """Latency is compared only on load scenarios (gate/analysis/judge.py adds
    `latency.coverage`, never advisory, when none was): a capacity search alone would hold
    on it every time after minutes of search, so the spec is refused naming `scenarios`.
    A gate of probes alone stays allowed (a diagnostic of outputs)."""
    with pytest.raises(SpecError) as err:
        parse_spec(BASE | {"scenarios": [{"suite": "capacity", "name": "cap"}]})
    found = [(p.path, p.message) for p in err.value.all_problems]
    assert len(found) == 1 and found[0][0] == "scenarios", found
    assert "'cap' needs a load scenario" in found[0][1] and "latency.coverage" in found[0][1]
    probes = parse_spec(BASE | {"scenarios": [{"suite": "correctness"}]})
    assert [s.is_load for s in probes.scenarios] == [False]
