"""A/A gates against engines that manage their connections as real servers do: a 5 s idle
timeout and 100 requests per connection, announced (llama.cpp's server) or silent (uvicorn's
idle close; the request after a connection's 100th closed unanswered). Real sim processes, real
HTTP, the real `gate run`, at a low rate with pauses and at a high rate. Neither engine may be
charged with an error, and the verdict document counts the requests sent again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gate.core.limits import Limits
from gate.core.settings import Settings
from gate.runs.schedules import Schedule
from gate.spec import parse_spec

pytestmark = pytest.mark.slow

SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]
HABITS = ["--keep-alive-timeout", "5", "--max-requests-per-connection", "100"]
LIMIT = 100

# Low rate: 128 requests in bursts with pauses (gamma gaps of shape 0.04, 5 req/s on average,
# about 28 s), so pooled connections go idle. With this seed the pauses include one of 4.5 s
# (past loadgen's 4 s retirement, inside the 5 s timeout) and one of 6.9 s (past the timeout:
# the engines close every idle connection). Checked below from the gate's own schedule.
LOW = {
    "name": "low",
    "arrival": "gamma",
    "burstiness": 0.04,
    "rate": 5,
    # 4 time blocks of 32 requests: the least that compares latency (fewer cannot, and hold)
    "requests": 128,
    "prompt_tokens": 32,
    "max_tokens": 8,
}
# High rate: a closed loop of 2, as fast as the engines answer (about 50-100 req/s here). Its
# client pool holds 2 connections, busy all the time, so none idles and each carries at most
# 100 requests: 400 requests need at least 4 connections, of which at most 2 are open at the
# end; at least 2 others reached the limit. That is what the assertions below rest on.
HIGH = {
    "name": "high",
    "arrival": "concurrency",
    "concurrency": 2,
    "requests": 400,
    "prompt_tokens": 32,
    "max_tokens": 8,
}
SPEC_SEED = 42
POLICY = {
    "extend": 0,
    # A/A on a busy two-core machine, the low scenario in bursts: latency is not what these
    # gates are about, so its tolerances are wide enough that jitter never decides them.
    "tolerance": {"p50": 0.5, "p90": 1.0, "p99": 1.0},
    "tail": {"tolerance": 1.0},
    # ... and the low scenario's 128 requests are too few for the paired checks to decide (4
    # time blocks of 32 requests, not 8): allowed, its latency left undecided.
    "short_scenarios": "allow",
}


def gate_spec(tag: str, *flags: str) -> dict[str, Any]:
    engine = {"command": [*SIM, "--tag", tag, "--profile", "tiny", *HABITS, *flags]}
    return {
        "name": "keepalive",
        "model": "demo-model",
        "seed": SPEC_SEED,
        "reference": engine,
        "candidate": {"command": [*engine["command"], "--seed", "2"]},
        "scenarios": [LOW, HIGH],
        "policy": POLICY,
    }


def run_gate(tmp_path: Path, spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [
            sys.executable, "-m", "gate", "run", str(path), "--json",
            "--db", f"sqlite:///{tmp_path / 'g.db'}", "--report-dir", str(tmp_path / "reports"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "GATE_DATA_DIR": str(tmp_path / ".gate")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout), out.stderr


def sim_counts(doc: dict[str, Any], role: str) -> dict[str, int]:
    """What the engine's connection habits did, from the line it logs as it exits."""
    text = Path(doc["engines"][role]["log"]).read_text()
    m = re.search(
        r"connections opened (\d+), closed idle (\d+), closed at the request limit (\d+); "
        r"requests closed unanswered (\d+)",
        text,
    )
    assert m is not None, text[-2000:]
    return dict(zip(("opened", "idle", "limit", "dropped"), map(int, m.groups()), strict=True))


def check_common(doc: dict[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """Zero errors on both engines in both scenarios, continue; returns the request counts."""
    assert doc["verdict"] == "continue", doc["reasons"]
    checks = {c["id"]: c for c in doc["checks"]}
    for name in ("low", "high"):
        assert checks[f"{name}.errors"]["decision"] == "pass", checks[f"{name}.errors"]
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for sc in doc["scenarios"]:
        counts[sc["name"]] = {}
        for role in ("reference", "candidate"):
            req = sc[role]["requests"]
            planned = LOW["requests"] if sc["name"] == "low" else HIGH["requests"]
            assert req["sent"] == req["ok"] == planned and req["errors"] == 0, (sc["name"], req)
            assert sum(sc[role]["errors_by_kind"].values()) == 0
            assert isinstance(req["resent"], int)
            counts[sc["name"]][role] = req
    assert set(counts) == {"low", "high"}
    report = Path(doc["report"]).read_text()
    assert ">sent again</th>" in report
    return counts


def test_the_low_rate_schedule_pauses_past_the_retirement_and_the_idle_timeout() -> None:
    """The schedule the gates below send is the gate's own, seeded: its pauses are known."""
    spec = parse_spec(gate_spec("x"))
    sched = Schedule.of(spec, spec.scenarios[0], Limits.from_settings(Settings()))
    assert sched.offsets is not None
    gaps = np.diff(sched.offsets)
    assert ((gaps > 4.2) & (gaps < 4.8)).any()  # loadgen retires the connection first
    assert (gaps > 6.5).any()  # the engines close every idle connection first
    assert sched.offsets[-1] < 30.0


def test_announced_keep_alive_a_a_gate_has_no_errors(tmp_path: Path, tag: str) -> None:
    doc, _ = run_gate(tmp_path, gate_spec(tag, "--announce-keep-alive"))
    counts = check_common(doc)
    for role in ("reference", "candidate"):
        sim = sim_counts(doc, role)
        # Told the limit, loadgen never sent a 101st request on a connection; the engine
        # closed at least 2 at their limit (HIGH) and idle ones in the low scenario's pause.
        assert sim["dropped"] == 0
        assert sim["limit"] >= 2 and sim["idle"] >= 1
        # In a closed loop no connection idles, and none is reused past its limit: nothing
        # can close under a request. (In the low scenario only a client stalled for over a
        # second between taking an idle connection and writing on it could see a close, and
        # would send again: allowed, and counted.)
        assert counts["high"][role]["resent"] == 0


def test_silent_keep_alive_a_a_gate_has_no_errors_and_counts_resends(
    tmp_path: Path, tag: str
) -> None:
    doc, _ = run_gate(tmp_path, gate_spec(tag))
    counts = check_common(doc)
    for role in ("reference", "candidate"):
        sim = sim_counts(doc, role)
        # Each request the engine closed unanswered at a connection's limit was sent again,
        # on a fresh connection, and answered: at least 2 per engine in the high scenario.
        assert counts["high"][role]["resent"] >= 2
        assert sim["dropped"] >= 2 and sim["idle"] >= 1
        # Every drop is a resend; a resend without a drop would be an idle close crossing a
        # request, which only a client stalled for over a second could meet.
        assert sim["dropped"] <= counts["low"][role]["resent"] + counts["high"][role]["resent"]
