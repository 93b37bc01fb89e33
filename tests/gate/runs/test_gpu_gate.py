"""Whole sim gates that read the engines' GPUs through the stand-in nvidia-smi on PATH
(simengine/nvidia_smi.py, the real tool's format: tests/support/captures/nvidia-smi/): each
sim writes its simulated GPUs' state for the CUDA_VISIBLE_DEVICES the gate gave it
(simengine/gpu.py), so a candidate flagged with a larger footprint or more joules per token is
what the gate measures end to end. A/A continues with the GPU checks present (and re-judges to
the same GPU checks from the stored document); each regression holds naming its check; without
any GPU source (this machine has no GPU and no nvidia-smi) one note says so and the gate
carries on. The A/A gate's report charts both engines' GPU memory and power.
Each gate: 400 requests at 100/s, about 7 s here."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gate.analysis.policy import Policy
from gate.core.database import make_engine, make_sessionmaker
from gate.core.settings import Settings
from gate.runs.runner import run_gate
from gate.service.rejudge import rejudge
from gate.spec import parse_spec
from gate.verdict.document import VerdictDocument
from simengine.gpu import STATE_DIR_ENV
from simengine.nvidia_smi import install

# timed_gate: energy per token is power integrated between the stand-in nvidia-smi's reads, a
# Python process per read; beside real vLLM they came too far apart over 4 s of load and an
# A/A gate measured a ratio of 0.58 (CI at 3fc915a). The verdicts rest on the reads' timing.
pytestmark = [pytest.mark.slow, pytest.mark.timed_gate]

SIM = [
    sys.executable,
    "-m",
    "simengine",
    "--port",
    "{port}",
    "--model",
    "{model}",
    "--profile",
    "tiny",
]


def gate(tmp: Path, *candidate: str) -> tuple[VerdictDocument, str]:
    spec = parse_spec(
        {
            "name": "gpu",
            "model": "demo-model",
            "seed": 7,
            "reference": {"command": [*SIM, "--seed", "1"]},
            "candidate": {"command": [*SIM, "--seed", "2", *candidate]},
            "scenarios": [
                {
                    "name": "steady",
                    "rate": 100,
                    "requests": 400,
                    "prompt_tokens": 32,
                    "max_tokens": 8,
                }
            ],
            "correctness": "off",
            # the engines' metrics and GPUs, read 4 times a second over the 4 s of load
            "telemetry": {"interval_s": 0.25},
            # 4 s of load makes fewer time blocks than the paired latency checks decide on:
            # latency is not what these gates are about.
            "policy": {"short_scenarios": "allow"},
        }
    )
    db = f"sqlite:///{tmp / 'gate.db'}"
    settings = Settings(data_dir=tmp / ".gate")
    out = asyncio.run(run_gate(spec, settings, db_url=db, report_dir=tmp / "reports"))
    return out.doc, db


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "gpus"))
    return tmp_path


def gpu_checks(doc: VerdictDocument) -> dict[str, Any]:
    return {c.id: c for c in doc.checks or [] if c.group == "gpu"}


def test_a_over_a_continues_with_the_gpu_checks_and_rejudges_to_them(stand_in: Path) -> None:
    doc, db = gate(stand_in)
    checks = gpu_checks(doc)
    assert doc.verdict == "continue", doc.reasons
    assert {k: c.decision for k, c in checks.items()} == {
        "gpu.memory": "pass",
        "gpu.energy_per_token": "pass",
        "gpu.xid": "pass",
    }
    assert checks["gpu.memory"].ratio == pytest.approx(1.0)
    assert 0.9 < checks["gpu.energy_per_token"].ratio < 1.1
    steady = doc.scenarios[0] if doc.scenarios else None
    tel = steady.telemetry if steady is not None else None
    assert tel is not None and tel.gpu_note is None and tel.candidate is not None
    assert "nvidia-smi (GPUs)" in tel.candidate.sources
    assert len(tel.candidate.series["gpu_memory_used_bytes"]) >= 3  # beside the engine's own
    assert "requests_running" in tel.candidate.series
    assert tel.candidate.config["gpu_model"] == "NVIDIA H100 80GB HBM3"
    # the report: both engines' GPU memory and power over the scenario, the card's GPU model
    (html,) = (stand_in / "reports").glob("*.html")
    page = html.read_text()
    assert "steady: GPU memory (engine metrics)" in page and "steady: GPU power" in page
    assert "<dt>GPU model</dt>" in page and "<dt>GPU driver</dt>" in page
    assert "NVIDIA H100 80GB HBM3" in page and "590.48.01" in page
    assert "GPU memory, energy and errors" in page  # the checks table's group
    # re-judged from the stored document, under a policy that would have held it
    factory = make_sessionmaker(make_engine(db))
    again = rejudge(factory, doc.gate_id, Policy(short_scenarios="allow"))
    assert {c.id: c.decision for c in again.checks if c.group == "gpu"} == {
        k: c.decision for k, c in checks.items()
    }
    strict = rejudge(
        factory, doc.gate_id, Policy(short_scenarios="allow", gpu={"energy_tolerance": 0.0})
    )
    energy = next(c for c in strict.checks if c.id == "gpu.energy_per_token")
    assert energy.decision == ("fail" if energy.ratio and energy.ratio > 1 else "pass")


@pytest.mark.parametrize(
    ("flags", "check", "said"),
    [
        (
            ("--gpu-memory-gib", "26"),
            "gpu.memory",
            "the candidate's 26.00 GiB against the reference's 20.00 GiB",
        ),
        (
            ("--gpu-j-per-token", "1.0"),
            "gpu.energy_per_token",
            "the candidate spends more energy per token",
        ),
    ],
    ids=["memory x1.3", "joules per token x2"],
)
def test_a_gpu_regression_holds_naming_it(
    stand_in: Path, flags: tuple[str, ...], check: str, said: str
) -> None:
    doc, _ = gate(stand_in, *flags)
    assert doc.verdict == "hold"
    assert [r.check for r in doc.reasons or []] == [check]
    assert said in gpu_checks(doc)[check].message


def test_no_gpu_visible_is_one_note_and_the_gate_carries_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
    )
    monkeypatch.setenv("PATH", path)
    doc, _ = gate(tmp_path, "--gpu-memory-gib", "40")  # invisible: nothing reads it
    assert doc.verdict == "continue" and gpu_checks(doc) == {}
    said = [n for n in doc.notes or [] if "No GPU is visible to the gate" in n]
    assert len(said) == 1
    (steady,) = doc.scenarios or []
    assert steady.telemetry is not None and steady.telemetry.gpu_note == said[0]
