"""Calibration: simulated gates are reproducible, cases differ only by what was injected, and
`gate calibrate` prints the document the issue asks for."""

from __future__ import annotations

import json

import pytest

from gate.analysis.calibration import CASES, Case, SimConfig, calibrate, simulate_gate
from gate.analysis.policy import Policy
from gate.cli import main

SMALL = SimConfig(limit=3_000, baseline_every=1_500)


def test_a_gate_is_a_pure_function_of_its_seed() -> None:
    case = Case("x", ttft=1.2)
    a = simulate_gate(case, Policy(), SMALL, 5)
    assert a == simulate_gate(case, Policy(), SMALL, 5)
    assert a.failed and a.requests is not None and a.requests <= SMALL.limit


def test_injected_cases_hold_and_aa_does_not() -> None:
    cases = [CASES[0], Case("TTFT x1.5", ttft=1.5), Case("bug", divergence="bug")]
    result = calibrate(Policy(), runs=3, seed=1, config=SMALL, cases=cases)
    by_name = {c.name: c for c in result.cases}
    assert by_name["A/A"].fail_rate == 0.0
    assert by_name["TTFT x1.5"].fail_rate == 1.0
    assert by_name["bug"].fail_rate == 1.0
    assert by_name["bug"].median_requests_to_hold == Policy().look_every
    doc = result.to_dict()
    # Every A/A hold counts as a false hold; at this small limit some are inconclusive.
    aa = by_name["A/A"]
    assert doc["aa_false_hold_rate"] == aa.hold_rate == aa.fail_rate + aa.inconclusive_rate
    assert doc["aa_failed_rate"] == 0.0
    assert [c["name"] for c in doc["cases"]] == ["A/A", "TTFT x1.5", "bug"]  # type: ignore[index]


@pytest.mark.simulation
def test_calibrate_command_prints_the_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    # every case, at the smallest size the command takes: the document's shape (two numerics
    # gates per case, not the default 200: their rates are tests/gate/analysis/
    # test_calibration_numerics.py's)
    argv = ["calibrate", "--runs", "1", "--limit", "1000", "--json", "--numerics-runs", "2"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"alpha", "aa_false_hold_rate", "cases", "numerics"} <= set(doc)
    assert doc["numerics"]["runs"] == 2
    for case in doc["cases"]:
        assert {
            "name",
            "hold_rate",
            "median_requests_to_hold",
            "baseline_hold_rate",
            "baseline_median_requests_to_hold",
        } <= set(case)
    assert {c["name"] for c in doc["cases"]} == {c.name for c in CASES}
    # and what it measures: a tail regression is held more often than identical engines
    argv = ["calibrate", "--runs", "2", "--limit", "4000", "--json", "--case", "A/A"]
    assert main([*argv, "--case", "tail >p95 x1.30"]) == 0
    doc = json.loads(capsys.readouterr().out)
    x130 = next(c for c in doc["cases"] if c["name"] == "tail >p95 x1.30")
    assert doc["aa_false_hold_rate"] < x130["hold_rate"]


def test_calibrate_command_table_and_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--runs", "0"]) == 2
    assert main(["calibrate", "--limit", "100"]) == 2
    assert "--limit" in capsys.readouterr().err


def test_calibrate_command_runs_only_the_named_cases(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["calibrate", "--runs", "1", "--limit", "1000", "--json", "--case", "A/A"]
    assert main([*argv, "--case", "TTFT x1.20"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in doc["cases"]] == ["A/A", "TTFT x1.20"]
    assert main(["calibrate", "--case", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--case: no case 'nope'" in err and "'A/A'" in err


def test_the_grid_has_every_model_and_size_and_the_cost_of_a_verdict() -> None:
    from gate.analysis.calibration import GRID_CASES, MODELS, calibrate_grid

    cells = calibrate_grid(Policy(), 2, sizes=(500,), errors_size=1_000)
    assert [c.model.name for c in cells[:4]] == [m.name for m in MODELS]
    assert [c.errors for c in cells[4:]] == ["1%, independent", "1% in bursts of 4"]
    for cell in cells[:4]:
        doc = cell.to_dict()
        assert doc["limit"] == 500 and doc["model"] == cell.model.name
        names = [c["name"] for c in doc["cases"]]  # type: ignore[attr-defined]
        assert names == [c.name for c in GRID_CASES]
        for c in cell.calibration.cases:
            assert c.median_requests_to_verdict is not None
            assert 0 < c.median_requests_to_verdict <= c.p90_requests_to_verdict <= 500  # type: ignore[operator]
            assert c.baseline_p90_requests_to_verdict is not None
