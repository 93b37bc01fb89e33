"""`gate calibrate --engines`: whole gates against real sim engine processes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gate.calibrate_engines import ENGINE_CASES, REQUESTS, spec_for
from gate.cli import main
from gate.spec import parse_spec


def test_every_engine_case_is_a_valid_spec_with_fresh_seeds_per_gate() -> None:
    for case in ENGINE_CASES:
        specs = [spec_for(case, k, seed=3) for k in range(2)]
        parsed = [parse_spec(s, case.name) for s in specs]
        assert parsed[0].scenarios[0].requests == REQUESTS
        assert any(sc.suite == "correctness" for sc in parsed[0].scenarios) == case.correctness
        ref0, ref1 = (s["reference"]["command"] for s in specs)
        assert ref0 != ref1  # another engine seed for every gate
        cand = specs[0]["candidate"]["command"]
        for flag in case.candidate:
            assert flag in cand
        if case.name == "A/A":
            strip = lambda cmd: cmd[: cmd.index("--seed")]  # noqa: E731
            assert strip(specs[0]["reference"]["command"]) == strip(cand)


@pytest.mark.slow
def test_engines_mode_runs_real_gates_and_the_baseline_on_their_samples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["calibrate", "--runs", "1", "--limit", "1000", "--json", "--engines"]
    assert main([*argv, "--engine-runs", "1", "--case", "TTFT x1.20"]) == 0
    out = capsys.readouterr()
    doc: dict[str, Any] = json.loads(out.out)
    assert [c["name"] for c in doc["cases"]] == ["TTFT x1.20"]  # the simulated one
    engines = doc["engines"]
    assert engines["runs"] == 1 and engines["baseline_metrics"] == ["ttft", "itl", "errors"]
    (case,) = engines["cases"]
    assert case["name"] == "TTFT x1.20" and case["runs"] == 1
    # A 20% TTFT regression over real HTTP: ours holds on the TTFT checks, early.
    assert case["hold_rate"] == 1.0
    assert "steady.ttft.p50" in case["reasons"]
    assert case["median_requests_to_hold"] <= REQUESTS
    # The baseline judged the same stored samples: TTFT x1.2 is well past its margin.
    assert case["baseline_hold_rate"] == 1.0
    assert "engines: TTFT x1.20 gate 1/1: hold" in out.err


def test_engines_mode_refuses_a_bad_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--engines", "--engine-runs", "0"]) == 2
    assert "--engine-runs" in capsys.readouterr().err
