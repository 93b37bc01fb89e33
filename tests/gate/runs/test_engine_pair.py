"""How a gate starts its two engines (gate/runs/engine_pair.py): one after the other when both
are processes on a host with no GPU, so that each engine's startup steps are its own and not
the contention for the CPUs they share (started together on two cores, identical vLLM servers
measured one step at 3.5 s against 0.4 s); both at once when each has its GPUs. The host's GPUs
are what `nvidia-smi` lists (gate/runs/testbed.py), here none or a stand-in script printing
NVIDIA's documented `--query-gpu=... --format=csv,noheader,nounits` form.

Starting in turn does not keep other work off the host's CPUs: each process engine's launch is
measured for it (`launch_host_busy`), and a startup rule that other work could explain is not
shown rather than held (gate/analysis/engines.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from gaterun import SIM, run_in_tmp, tiny_spec
from sqlalchemy import select

from gate.core.database import make_engine, make_sessionmaker
from gate.models import GatePhase
from gate.spec import parse_spec

pytestmark = pytest.mark.slow


def _path_without_nvidia_smi() -> str:
    return os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists()
    )


def _phases(tmp_path: Path, tag: str) -> tuple[dict[str, float], dict[str, float], list[str]]:
    doc = run_in_tmp(tiny_spec(tag, name="launch", rate=40, requests=40), tmp_path).document
    factory = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'g.db'}"))
    with factory() as s:
        rows = s.scalars(select(GatePhase).where(GatePhase.role == "gate")).all()
        gate = [f"{r.phase} {r.detail or ''}" for r in rows]
    return doc["engines"]["reference"]["phases"], doc["engines"]["candidate"]["phases"], gate


def test_engines_that_share_the_hosts_cpus_start_one_after_the_other(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _path_without_nvidia_smi())
    assert shutil.which("nvidia-smi") is None
    ref, cand, gate = _phases(tmp_path, tag)
    # the candidate was launched only once the reference answered its model list
    assert ref["model_listed"] <= cand["launched"], (ref, cand)
    assert any("one engine after the other" in p for p in gate), gate


def test_engines_on_a_host_with_gpus_start_together(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\nprintf "NVIDIA H100 80GB HBM3, 570.124.06, 81559\\n"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{_path_without_nvidia_smi()}")
    ref, cand, gate = _phases(tmp_path, tag)
    # both launched before either could answer: a Python engine process takes far longer to
    # import and bind than the gate takes to spawn the second one
    assert cand["launched"] < ref["model_listed"] and ref["launched"] < cand["model_listed"]
    assert not any("one engine after the other" in p for p in gate), gate


# Spins at the lowest priority: it keeps every CPU busy without delaying the engines much (CFS
# gives a nice-19 task about 1.5% of a CPU wanted by a nice-0 one), as a CI runner's other jobs
# keep its CPUs busy.
_SPIN = "import os\nos.nice(19)\nwhile True:\n    pass\n"


def test_a_launch_while_other_work_holds_the_cpus_is_not_held_for_its_startup(
    tmp_path: Path, tag: str
) -> None:
    sim = [*SIM, "--tag", tag, "--profile", "tiny"]
    spec = parse_spec(
        {
            "name": "busy-host",
            "model": "demo-model",
            "reference": {"command": sim},
            # 3 s before its port opens, against about none: port_open's rule (1.5x + 2 s)
            # fails on a quiet host.
            "candidate": {"command": [*sim, "--load-s", "3"]},
            "scenarios": [{"name": "steady", "rate": 20, "requests": 168, "max_tokens": 4}],
            "policy": {"short_scenarios": "allow"},
        }
    )
    n = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(n)]
    try:
        doc = run_in_tmp(spec, tmp_path).document
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    engines = doc["engines"]
    for role in ("reference", "candidate"):
        busy = engines[role]["launch_host_busy"]
        assert busy is not None and 0.5 <= busy <= 1.0, (role, busy)
    checks = {c["id"]: c for c in doc["checks"]}
    port = checks["startup.phase.port_open"]
    assert port["decision"] == "undecided" and not port["required"], port
    assert "during the candidate's launch" in port["message"], port["message"]
    assert doc["verdict"] == "continue", doc["reasons"]
    assert "startup.phase.port_open" in {r["check"] for r in doc["not_shown"]}
