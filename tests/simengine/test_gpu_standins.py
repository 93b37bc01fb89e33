"""The sim's simulated GPUs (simengine/gpu.py) and the stand-ins that show them: a real sim
process with CUDA_VISIBLE_DEVICES writes its GPUs' state (the footprint of --gpu-memory-gib,
power and energy that rise with the tokens it generates, an XID at its time), and the stand-in
nvidia-smi prints it in the real tool's format, checked against the capture of an H100
(tests/support/captures/nvidia-smi/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gate.telemetry.nvidia_smi import FIELDS
from simengine.cli import parse_args
from simengine.gpu import STATE_DIR_ENV
from simengine.launch import SimPool
from simengine.nvidia_smi import install, render

CAPTURES = Path(__file__).parents[1] / "support" / "captures" / "nvidia-smi"
ASKED = list(FIELDS)  # the fields the gate asks (gate/telemetry/nvidia_smi.py)


def capture(name: str) -> dict[str, str]:
    header, row = (CAPTURES / name).read_text().splitlines()
    return dict(zip(header.split(", "), row.split(", "), strict=True))


def test_the_stand_in_prints_what_nvidia_smi_printed() -> None:
    """The capture's own values through the stand-in: header and line equal the real
    tool's cells for the same fields, units and all, and `nounits` drops exactly them."""
    real = capture("h100-590.48.01-load.csv")
    state = {
        "index": 0,
        "uuid": real["uuid"],
        "name": real["name"],
        "driver_version": real["driver_version"],
        "pci_bus_id": real["pci.bus_id"],
        "memory_used_mib": 19818,
        "memory_total_mib": 81559,
        "power_w": 631.95,
        "utilization_pct": 100,
    }
    header, line = render([state], ASKED, header=True, units=True)
    want = [k for k in real if k.split(" [")[0] in ASKED]
    want.sort(key=lambda k: ASKED.index(k.split(" [")[0]))
    assert header == ", ".join(want)
    assert line == ", ".join(real[k] for k in want)
    (bare,) = render([state], ASKED, header=False, units=False)
    assert bare.split(", ")[4:] == ["19818", "81559", "631.95", "100"]


def read_state(directory: Path, index: int) -> dict[str, object]:
    return json.loads((directory / f"{index}.json").read_text())


def test_a_sim_process_writes_its_gpus(
    launcher: SimPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    sim = launcher.start(
        "--profile",
        "tiny",
        "--gpu-memory-gib",
        "30",
        "--gpu-idle-w",
        "50",
        "--gpu-j-per-token",
        "2",
        "--gpu-xid",
        "79:1.5",
    )
    time.sleep(0.3)
    before = read_state(tmp_path, 6)
    assert before["memory_used_mib"] == 15 * 1024  # 30 GiB over two GPUs
    assert before["xids"] == []
    body = {"model": "demo-model", "prompt": "hello", "max_tokens": 64}
    httpx.post(f"{sim.url}/v1/completions", json=body, timeout=30).raise_for_status()
    time.sleep(0.3)
    after = read_state(tmp_path, 6)
    # 64 tokens at 2 J each over two GPUs, on top of 50 W of idle each
    spent_j = (int(after["energy_mj"]) - int(before["energy_mj"])) / 1000  # type: ignore[call-overload]
    assert spent_j >= 64.0 - 1e-6
    time.sleep(1.5)
    assert read_state(tmp_path, 4)["xids"] == [79]
    smi = install(tmp_path / "bin")
    out = subprocess.run(
        [str(smi), "--query-gpu=index,memory.used,power.draw", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    ).stdout.splitlines()
    assert [line.split(", ")[:2] for line in out] == [["4", "15360"], ["6", "15360"]]


def test_the_stand_in_refuses_what_nvidia_smi_refuses(tmp_path: Path) -> None:
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "simengine.nvidia_smi",
            "--query-gpu=index,nonsense",
            "--format=csv",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, STATE_DIR_ENV: str(tmp_path)},
    )
    assert bad.returncode == 2 and 'Field "nonsense" is not a valid field' in bad.stderr
    none = subprocess.run(
        [sys.executable, "-m", "simengine.nvidia_smi", "--query-gpu=index", "--format=csv"],
        capture_output=True,
        text=True,
        env={**os.environ, STATE_DIR_ENV: str(tmp_path)},
    )
    assert none.returncode == 6 and "No devices were found" in none.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu-memory-gib", "-1"], "--gpu-memory-gib must be a finite number >= 0"),
        (["--gpu-xid", "79"], "not CODE:AT_S"),
        (["--gpu-xid", "0:3"], "CODE > 0"),
    ],
)
def test_bad_gpu_flags_are_refused_naming_them(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        parse_args(["--port", "0", *flags])
    assert done.value.code == 2 and message in capsys.readouterr().err
