"""A whole `gate run` between a whole sim and a disaggregated one with the same settings: the
gate must find nothing wrong with the disaggregated engine's answers (correctness, the
compatibility probes, errors, crashes). Latency is not asserted: a prefill, a KV transfer and a
decode step behind a router give a longer TTFT than one engine, which is what such a gate is
for. The candidate is attached by URL; launching the groups is the launcher's part of issue 20.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gate.core.vocabulary import EXIT_CONTINUE, EXIT_HOLD
from simengine.launch import SimPool

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]
STEADY = {"name": "steady", "arrival": "poisson", "rate": 10, "requests": 60}


def test_a_gate_finds_the_disaggregated_sims_answers_a_whole_sims(
    tmp_path: Path, tag: str, find_processes: Callable[[str], list[int]]
) -> None:
    flags = ("--profile", "tiny", "--tag", tag)
    with SimPool(workdir=tmp_path, cwd=REPO_ROOT) as pool:
        pd = pool.start_pd(*flags, router=("--tag", tag))
        assert len(find_processes(tag)) == 3
        spec = {
            "name": "pd",
            "model": "demo-model",
            "seed": 42,
            "reference": {"command": [*SIM, *flags]},
            "candidate": {"url": pd.url},
            "scenarios": [{**STEADY, "prompt_tokens": 32, "max_tokens": 16}],
            # 6 s of load cannot compare latency (fewer than 8 time blocks): allowed, the
            # latency checks left undecided; the answers are what this gate is about.
            "policy": {"short_scenarios": "allow"},
        }
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        out = subprocess.run(
            [
                sys.executable, "-m", "gate", "run", str(path), "--json",
                "--db", f"sqlite:///{tmp_path / 'g.db'}",
                "--report-dir", str(tmp_path / "reports"),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "GATE_DATA_DIR": str(tmp_path / ".gate")},
        )  # fmt: skip
        # Continue or hold on latency (this short scenario cannot compare it), never an error.
        assert out.returncode in (EXIT_CONTINUE, EXIT_HOLD), out.stderr[-3000:]
        doc = json.loads(out.stdout)
    checks = {c["id"]: c["decision"] for c in doc["checks"]}
    answers = [i for i in checks if i.startswith(("correctness.", "compat."))]
    assert len(answers) >= 10, checks
    for name in [*answers, "steady.errors", "crash.reference", "crash.candidate"]:
        assert checks[name] == "pass", (name, checks)
    assert all(r["check"].startswith("steady.") for r in doc["reasons"]), doc["reasons"]
    for scenario in doc["scenarios"]:
        requests = scenario["candidate"]["requests"]
        assert requests["errors"] == 0 and requests["ok"] == requests["sent"], requests
