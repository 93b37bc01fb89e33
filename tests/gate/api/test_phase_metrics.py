"""`gate_phase_seconds` and `gate_engine_phase_seconds` are the seconds spent in each phase:
from a phase's `at_s` to the next phase's `at_s` of the same gate and role. Not the time since
the gate started, and not the time it took to reach a phase from the one before."""

from __future__ import annotations

from typing import Any

import pytest
from apitools import auth, spec_dict
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gate.api.ops import phase_durations
from gate.runs import rows
from gate.service import service
from gate.spec import parse_spec

# A finished gate: each gate phase below lasts until the next row (released is its last).
FINISHED = [
    ("gate", "requested", 0.0),
    ("gate", "waiting_for_capacity", 0.2),  # requested lasted 0.2 s
    ("gate", "reserved", 1.2),  # waited 1.0 s for capacity
    ("candidate", "launched", 1.3),
    ("candidate", "process_up", 1.8),  # launched lasted 0.5 s
    ("candidate", "model_listed", 2.8),  # process_up 1.0 s
    ("gate", "scenario:steady", 4.2),  # reserved (launch, warm-up) 3.0 s
    ("candidate", "warmup_done", 4.0),  # model_listed (the warm-up) 1.2 s
    ("candidate", "ready", 4.0),  # warmup_done 0 s
    ("gate", "scenario:burst", 13.2),  # steady lasted 9 s
    ("gate", "judging", 39.2),  # burst 26 s
    ("candidate", "stopped", 39.5),  # ready (serving) 35.5 s; stopped is its last
    ("gate", "released", 40.0),  # judging (and teardown) 0.8 s
]
# A gate in its first scenario now: the scenario it is in has no duration yet.
RUNNING = [
    ("gate", "requested", 0.0),
    ("gate", "reserved", 2.0),  # requested 2.0 s
    ("gate", "scenario:steady", 5.0),  # reserved 3.0 s; steady still running
]

GATE_SECONDS = {  # phase: the durations of both gates
    "requested": [0.2, 2.0],
    "waiting_for_capacity": [1.0],
    "reserved": [3.0, 3.0],
    "scenario": [9.0, 26.0],
    "judging": [0.8],
}
ENGINE_SECONDS = {
    "launched": [0.5],
    "process_up": [1.0],
    "model_listed": [1.2],
    "warmup_done": [0.0],
    "ready": [35.5],
}


def _rows(gate_id: str, phases: list[tuple[str, str, float]]) -> list[tuple[str, str, str, float]]:
    return [(gate_id, role, phase, at) for role, phase, at in phases]


def test_phase_durations_are_from_each_phase_to_the_next() -> None:
    rows = _rows("a", FINISHED) + _rows("b", RUNNING)
    rows.sort(key=lambda r: (r[0], r[1], r[3]))  # gate, role, at_s: the database's order
    got = {k: pytest.approx(v) for k, v in phase_durations(rows).items()}
    want = {("gate", p): v for p, v in GATE_SECONDS.items()}
    want |= {("candidate", p): v for p, v in ENGINE_SECONDS.items()}
    assert got == want
    assert ("gate", "released") not in got and ("candidate", "stopped") not in got


def _histograms(text: str, name: str) -> dict[tuple[str, ...], dict[str, Any]]:
    """{label values without `le`: {"count", "sum", "buckets": {le: count}}}"""
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            key = tuple(labels[k] for k in sorted(labels))
            h = out.setdefault(key, {"buckets": {}})
            if s.name.endswith("_bucket"):
                h["buckets"][s.labels["le"]] = s.value
            elif s.name.endswith("_count"):
                h["count"] = s.value
            elif s.name.endswith("_sum"):
                h["sum"] = s.value
    return out


def test_metrics_report_the_seconds_spent_in_each_phase(
    app_client: TestClient, tokens: dict[str, str]
) -> None:
    factory = app_client.app.state.ctx.factory  # type: ignore[attr-defined]
    for phases in (FINISHED, RUNNING):
        run, _ = service.create_gate(
            factory, parse_spec(spec_dict("m", trusted=True)), source="api"
        )
        service.request_cancel(factory, run.id, admin=True)  # nothing runs it: rows are ours
        for role, phase, at in phases:
            rows.record_phase(factory, run.id, role, phase, at, None)
    text = app_client.get("/metrics", headers=auth(tokens["read"])).text

    gate = _histograms(text, "gate_phase_seconds")
    assert set(gate) == {(p,) for p in GATE_SECONDS}  # no released: nothing follows it
    for phase, values in GATE_SECONDS.items():
        h = gate[(phase,)]
        assert h["count"] == len(values), phase
        assert h["sum"] == pytest.approx(sum(values)), phase
        assert h["buckets"]["+Inf"] == len(values)
    scenario = gate[("scenario",)]["buckets"]
    assert (scenario["5"], scenario["10"], scenario["30"]) == (0, 1, 2)
    assert gate[("reserved",)]["buckets"]["2"] == 0  # 3 s each, not 1.2 s since the start

    engine = _histograms(text, "gate_engine_phase_seconds")
    assert set(engine) == {(p, "candidate") for p in ENGINE_SECONDS}  # labels: phase, role
    for phase, values in ENGINE_SECONDS.items():
        assert engine[(phase, "candidate")]["count"] == len(values), phase
        assert engine[(phase, "candidate")]["sum"] == pytest.approx(sum(values)), phase

    helps = {f.name: f.documentation for f in text_string_to_metric_families(text)}
    assert helps["gate_phase_seconds"].startswith("Seconds a gate spent in each of its phases")
    assert helps["gate_engine_phase_seconds"].startswith("Seconds an engine spent in each")
