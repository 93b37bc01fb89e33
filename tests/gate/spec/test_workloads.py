"""A scenario's `workload:` in the spec (gate/spec/workloads.py) and against the caps
(gate/spec/limits.py), then built under the operator's directory (gate/runs/workloads.py):
every mistake named by its field path, a file's by its line and field too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gate.core.errors import SpecError, WorkloadError
from gate.core.limits import Limits
from gate.runs.schedules import plan_gate, plan_problems
from gate.runs.workloads import WorkloadFiles
from gate.spec import GateSpec, parse_spec, spec_limit_problems

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "workloads"


def gate(*scenarios: dict[str, Any]) -> GateSpec:
    return parse_spec(
        {
            "name": "w",
            "model": "m",
            "reference": {"url": "http://127.0.0.1:1"},
            "candidate": {"url": "http://127.0.0.1:2"},
            "scenarios": list(scenarios),
            "policy": {"short_scenarios": "allow"},
        }
    )


def problems(*scenarios: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        gate(*scenarios)
    return {p.path: p.message for p in err.value.all_problems}


SESSIONS = {"kind": "sessions", "turns": 3, "think_s": 0.5}


@pytest.mark.parametrize(
    ("scenario", "path", "words"),
    [
        ({"workload": {"kind": "sessions"}}, "workload.turns", "required by a sessions part"),
        (
            {"workload": {"mix": [SESSIONS, {**SESSIONS, "groups": 2}]}},
            "workload.mix[1].groups",
            "not a field of a sessions part",
        ),
        (
            {"workload": {"kind": "shared_prefix", "groups": 4}},
            "workload.prefix_tokens",
            "required",
        ),
        ({"workload": {"kind": "openai"}}, "workload.file", "required by a openai part"),
        (
            {"workload": {"kind": "openai", "file": "../etc/log.jsonl"}},
            "workload.file",
            "no `..`",
        ),
        (
            {"workload": {"kind": "openai", "file": "/var/log/requests.jsonl"}},
            "workload.file",
            "no leading `/`",
        ),
        (
            {"workload": {"mix": [{"kind": "trace", "file": "t.jsonl"}, SESSIONS]}},
            "workload.mix",
            "a trace replays its own instants",
        ),
        ({"workload": SESSIONS, "requests": None}, "requests", "exactly one of"),
        ({"workload": SESSIONS, "rate": None}, "rate", "required with a workload"),
        (
            {"workload": SESSIONS, "arrival": "concurrency", "concurrency": 4, "rate": None},
            "arrival",
            "open loop",
        ),
        ({"workload": {"kind": "nope"}}, "workload.mix[0].kind", "Input should be"),
    ],
)
def test_a_workload_mistake_is_named_by_its_field(
    scenario: dict[str, Any], path: str, words: str
) -> None:
    sc = {"name": "s", "rate": 5, "requests": 20, **scenario}
    found = problems({k: v for k, v in sc.items() if v is not None})
    assert words in found.get(f"scenarios[0].{path}", ""), found


def test_a_trace_needs_no_rate_and_a_suite_takes_no_workload() -> None:
    trace = {"kind": "trace", "file": "t.jsonl"}
    spec = gate({"name": "replay", "workload": trace})
    assert spec.scenarios[0].workload is not None and spec.scenarios[0].workload.trace
    found = problems({"name": "r", "requests": 3, "duration_s": 2, "workload": trace})
    assert "at most one" in found["scenarios[0].requests"]
    found = problems({"suite": "normal", "workload": SESSIONS})
    assert "not a setting of suite normal" in found["scenarios[0].workload"]


def test_the_caps_bind_each_part_by_arithmetic() -> None:
    spec = gate(
        {
            "name": "s",
            "rate": 5,
            "requests": 10,
            "workload": {
                "mix": [
                    {"kind": "long_context", "prompt_tokens": 40_000},
                    {"kind": "shared_prefix", "prefix_tokens": 30_000, "prompt_tokens": 3_000},
                    {**SESSIONS, "turns": 100, "max_tokens": 9_000},
                ]
            },
        }
    )
    found = {p.path: p.message for p in spec_limit_problems(spec, Limits())}
    assert "40000 is above the cap of 32768" in found["scenarios[0].workload.mix[0].prompt_tokens"]
    assert "33000 is above the cap" in found["scenarios[0].workload.mix[1].prompt_tokens"]
    assert "MAX_SESSION_TURNS" in found["scenarios[0].workload.mix[2].turns"]
    assert "MAX_OUTPUT_TOKENS" in found["scenarios[0].workload.mix[2].max_tokens"]
    # 10 sessions of up to 100 turns: sized as 1000 requests, capped like any others
    small = Limits(max_scenario_requests=500)
    found = {p.path: p.message for p in spec_limit_problems(spec, small)}
    assert "1000 is above the cap of 500" in found["scenarios[0].requests"]


def test_every_example_workload_spec_plans() -> None:
    """examples/workloads/*.yaml load and plan from the repository root (their files are
    named from there), and again under a GATE_WORKLOAD_DIR that holds them."""
    from gate.spec import load_spec

    root = EXAMPLES.parents[1]
    specs = sorted(EXAMPLES.glob("*.yaml"))
    assert len(specs) >= 3
    for path in specs:
        plan = plan_gate(load_spec(path), Limits(), WorkloadFiles(root, confined=True))
        assert all(s.traffic is not None for s in plan.schedules.values()), path


def test_the_built_workload_meets_the_caps_arithmetic_could_not_see(tmp_path: Path) -> None:
    rows = [{"timestamp": 100 * i, "input_length": 4, "output_length": 2} for i in range(30)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = gate({"name": "replay", "workload": {"kind": "trace", "file": "t.jsonl"}})
    files = WorkloadFiles(tmp_path, confined=True)
    assert plan_problems(spec, Limits(), files) == []
    found = plan_problems(spec, Limits(max_scenario_requests=20), files)
    assert [p.path for p in found] == ["scenarios[0]"]
    assert "30 requests, above the cap of 20" in found[0].message
    found = plan_problems(spec, Limits(max_workload_records=10), files)
    assert found[0].message == "t.jsonl line 11: more than the cap of 10 records"
    found = plan_problems(spec, Limits(max_scenario_duration_s=2), files)
    assert "the trace spans 3 s, above the cap of 2 s" in found[0].message
    with pytest.raises(WorkloadError, match="GATE_WORKLOAD_DIR"):
        plan_gate(spec, Limits(), WorkloadFiles(None, confined=True))
    # `gate run` without a directory: relative to its working directory
    gone = plan_problems(spec, Limits(), WorkloadFiles(None, confined=False))
    assert "t.jsonl: cannot be read" in gone[0].message
