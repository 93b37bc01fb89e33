"""How a gate starts its two engines (gate/runs/engine_pair.py): one after the other when both
are processes on a host with no GPU, so that each engine's startup steps are its own and not
the contention for the CPUs they share (started together on two cores, identical vLLM servers
measured one step at 3.5 s against 0.4 s); both at once when each has its GPUs. The host's GPUs
are what `nvidia-smi` lists (gate/runs/testbed.py), here none or a stand-in script printing
NVIDIA's documented `--query-gpu=... --format=csv,noheader,nounits` form."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from gaterun import run_in_tmp, tiny_spec
from sqlalchemy import select

from gate.core.database import make_engine, make_sessionmaker
from gate.models import GatePhase

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
