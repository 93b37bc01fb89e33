"""What a gate records of its test bed (gate/runs/testbed.py): the GPUs of a real
`nvidia-smi` process on PATH (a stand-in script printing NVIDIA's documented
`--query-gpu=... --format=csv,noheader,nounits` form, one line per GPU: `name, driver_version,
memory.total`), none with the reason when there is no nvidia-smi or it fails, and per engine its
program, preset or image."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gate.runs.testbed import describe_testbed, engine_software, parse_nvidia_smi, visible_gpus
from gate.spec import EngineSpec, parse_spec

SMI_LINES = "NVIDIA H200, 570.124.06, 143771\nNVIDIA H200, 570.124.06, 143771\n"


def fake_smi(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_gpus_as_nvidia_smi_lists_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = fake_smi(
        tmp_path,
        f'[ "$1" = "--query-gpu=name,driver_version,memory.total" ] && printf "{SMI_LINES}"',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    gpus, note = visible_gpus()
    assert note is None and len(gpus) == 2
    assert (gpus[0].model, gpus[0].driver, gpus[0].memory_mib) == (
        "NVIDIA H200",
        "570.124.06",
        143771,
    )


def test_no_gpus_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    assert visible_gpus() == ([], "not visible: no nvidia-smi on the gate's host")
    bin_dir = fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    monkeypatch.setenv("PATH", str(bin_dir))
    gpus, note = visible_gpus()
    assert gpus == [] and note == "not visible: nvidia-smi listed none (exit 9)"


def test_lines_that_do_not_fit_are_skipped() -> None:
    assert parse_nvidia_smi("garbage\n, 1, 2\nNVIDIA A100, , [N/A]\n") == [
        parse_nvidia_smi("NVIDIA A100, x, 1")[0].model_copy(
            update={"driver": None, "memory_mib": None}
        )
    ]


def test_each_engine_says_what_it_ran() -> None:
    sim = EngineSpec.model_validate(
        {"command": ["/venv/bin/python", "-m", "simengine", "--port", "{port}"]}
    )
    assert (
        engine_software(sim, ("0.2.0-sim", None), None).program == "/venv/bin/python -m simengine"
    )
    vllm = EngineSpec.model_validate({"preset": "vllm"})
    sw = engine_software(vllm, (None, "GET /version answered 404"), None)
    assert (sw.program, sw.version, sw.version_note) == (
        "preset:vllm",
        None,
        "GET /version answered 404",
    )
    spec = parse_spec(
        {
            "name": "bed",
            "model": "m",
            "reference": {"command": ["sim", "--port", "{port}"]},
            "candidate": {"command": ["sim", "--port", "{port}", "--fast"]},
            "scenarios": [{"name": "steady", "rate": 10, "requests": 10}],
            "policy": {"short_scenarios": "allow"},
        }
    )
    bed = describe_testbed(spec, {}, {})
    assert bed.aa is False and bed.identity is not None and len(bed.identity) == 16
    assert bed.engines["candidate"].version_note is not None
    assert bed.engines["candidate"].version_note.startswith("not asked")
