"""Overload is named, not averaged (issue 28): whole gates on real sim engine processes where one
engine serves one sequence at a time (vLLM's `--max-num-seqs 1`, which the sim imitates) at a
rate above what that allows, so its queue grows through the scenario.

The sim's demo profile takes a 40 ms prefill and 12 ms per decode step: with 4 output tokens a
request holds the single slot for about 90 ms, 11 requests/s at most; the scenario offers 15/s
(the queue gains about 0.35 s of waiting per second). With 256 slots the reference serves the
same load without a queue."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gaterun import run_in_tmp

from gate.spec import parse_spec

# timed_gate: whether a queue grows is what the gates measure: other tests on the cores grow it.
pytestmark = [pytest.mark.slow, pytest.mark.timed_gate]

SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]
STEADY = {"name": "steady", "rate": 15, "requests": 300, "prompt_tokens": 32, "max_tokens": 8}


def _run(tmp_path: Path, tag: str, reference: list[str], candidate: list[str]) -> Any:
    spec = parse_spec(
        {
            "name": "saturation",
            "model": "demo-model",
            "reference": {"command": [*SIM, "--tag", tag, *reference]},
            "candidate": {"command": [*SIM, "--tag", tag, *candidate]},
            "scenarios": [STEADY],
            "correctness": "off",
        }
    )
    out = run_in_tmp(spec, tmp_path)
    return out.document


def test_a_candidate_whose_queue_grows_is_held_and_named(tmp_path: Path, tag: str) -> None:
    doc = _run(tmp_path, tag, [], ["--max-num-seqs", "1"])
    assert doc["verdict"] == "hold"
    checks = {c["id"]: c for c in doc["checks"]}
    sat = checks["steady.saturation.candidate"]
    assert sat["decision"] == "fail"
    assert "queue grows" in sat["message"]
    assert "gate.environment" not in checks  # the reference kept up
    # Every interval the verdict reports stays within sane bounds (judge v2 reported an ITL
    # interval of 5e-16x to 3e18x on such a gate).
    for c in doc["checks"]:
        lo, hi = c["interval"] or (None, None)
        if lo is not None and hi is not None and lo > 0:
            assert hi / lo < 100, (c["id"], c["interval"])


def test_a_reference_whose_queue_grows_is_the_test_beds_fault(tmp_path: Path, tag: str) -> None:
    doc = _run(tmp_path, tag, ["--max-num-seqs", "1"], ["--max-num-seqs", "1"])
    assert doc["verdict"] == "hold"
    env = next(c for c in doc["checks"] if c["id"] == "gate.environment")
    assert env["decision"] == "undecided" and env["required"]
    assert "beyond what the test bed can serve" in env["message"]
    assert any(r["check"] == "gate.environment" for r in doc["reasons"])
