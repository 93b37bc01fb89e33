"""Which tool reads which engine's GPUs and an engine's GPUs as one source of the sampler
(gate/telemetry/gpu_sources.py), read through the stand-in nvidia-smi by the gate's Sampler;
NVML through nvidia-ml-py where its library loads (not here: there is no GPU)."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gate.telemetry import nvml
from gate.telemetry.dcgm import DcgmSource
from gate.telemetry.gpu import MIB
from gate.telemetry.gpu_sources import EngineGpus, EngineGpuSource, choose_sources
from gate.telemetry.nvidia_smi import NvidiaSmiSource
from gate.telemetry.sampler import Sampler
from simengine.gpu import STATE_DIR_ENV, SimGpus
from simengine.nvidia_smi import install

PROCESS = {
    "reference": EngineGpus("process", (("local", (0,)),)),
    "candidate": EngineGpus("process", (("local", (1,)),)),
}


def no_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
    )
    monkeypatch.setenv("PATH", path)


def test_this_machine_has_no_gpu_one_note_and_no_source(monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvidia_smi(monkeypatch)
    assert nvml.load() is None  # NVMLError_LibraryNotFound: no driver here
    assert shutil.which("nvidia-smi") is None
    chosen = choose_sources(PROCESS, "auto", None)
    assert chosen.sources == {}
    assert chosen.notes == [
        "No GPU is visible to the gate (NVML's library could not be loaded and nvidia-smi is "
        "not on PATH): GPU memory, energy per token and XID errors of the reference and "
        "candidate were not compared."
    ]


def test_kubernetes_engines_read_dcgm_attached_ones_nothing_off_is_said() -> None:
    k8s = {
        "reference": EngineGpus("kubernetes", (("node-a", (0, 1)), ("node-b", (0, 1)))),
        "candidate": EngineGpus("endpoint"),
    }
    chosen = choose_sources(k8s, "auto", "http://{node}:9400/metrics")
    assert isinstance(chosen.sources["reference"], DcgmSource) and "candidate" not in chosen.sources
    unset = choose_sources(k8s, "auto", None)
    assert "no DCGM exporter is configured (GATE_DCGM_URL)" in unset.notes[0]
    assert "GATE_GPU_TELEMETRY=off" in choose_sources(PROCESS, "off", None).notes[0]


def write_gpus(directory: Path, tokens: int) -> None:
    for index, memory in ((0, 20.0), (1, 30.0)):
        g = SimGpus(directory, [index], memory, 100.0, 1.0, ())
        g.write(tokens, 1)


def test_the_sampler_reads_both_engines_through_one_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    write_gpus(tmp_path / "gpus", 0)
    chosen = choose_sources(PROCESS, "nvidia-smi", None)
    ref, cand = chosen.sources["reference"], chosen.sources["candidate"]
    assert isinstance(ref, NvidiaSmiSource) and isinstance(cand, NvidiaSmiSource)
    assert ref.query is cand.query  # one process per tick for both engines

    def scenario() -> dict[str, Any]:
        sampler = Sampler(
            {role: [EngineGpuSource(s)] for role, s in chosen.sources.items()}, interval_s=0.2
        )
        for _ in range(3):
            sampler.tick()
        return sampler.timelines

    lines = scenario()
    cand_line = lines["candidate"]
    assert cand_line.sources == ["nvidia-smi (GPUs)"] and len(cand_line.t_s) == 3
    assert set(cand_line.series["gpu_memory_used_bytes"]) == {30 * 1024 * MIB}
    assert cand_line.config == {
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpu_driver": "590.48.01",
        "gpu_count": "1",
    }
    assert "gpu_energy_joules_total" not in cand_line.series  # nvidia-smi has no counter
    assert lines["reference"].series["gpu_xid_errors_total"] == [0.0, 0.0, 0.0]
    # the tool breaks: a gap with its reason, never an error
    shutil.rmtree(tmp_path / "gpus")
    again = scenario()["reference"]
    assert again.gaps == 3 and again.series == {}
    assert again.notes == ["nvidia-smi (GPUs): nvidia-smi exited 6: No devices were found"]


class FakeNvml:
    """pynvml's surface as NVML answers on a GPU (units: bytes, mW, mJ, %), with pynvml's
    own error classes; there is no GPU here to answer for real."""

    NVMLError = pynvml.NVMLError
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self) -> None:
        self.events = [SimpleNamespace(device="h1", eventData=79)]

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "590.48.01"

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetName(self, h: str) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=19818 * MIB, total=81559 * MIB)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 631950

    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # pre-Volta

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=100, memory=40)

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: str, kinds: int, s: str) -> None:
        assert kinds == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> Any:
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop()

    def nvmlEventSetFree(self, s: str) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None


def test_nvml_readings_in_the_gates_units_and_an_engines_xids() -> None:
    source = nvml.NvmlSource([0, 1], FakeNvml())
    zero, one = source.read()
    assert (zero.index, zero.uuid, zero.driver) == (0, "GPU-h0", "590.48.01")
    assert zero.memory_used_bytes == 19818 * MIB and zero.power_w == pytest.approx(631.95)
    assert zero.energy_j is None and zero.utilization_pct == 100  # unsupported: unknown
    assert (zero.xids, one.xids) == ((), (79,))
    assert [g.xids for g in source.read()] == [(), ()]
    # as one engine's source: both GPUs summed, the XID counted once and its code kept
    engine = EngineGpuSource(nvml.NvmlSource([0, 1], FakeNvml()))
    first = {s.metric: s.value for s in engine.read() if s.text is None}
    assert first["gpu_memory_used_bytes"] == 2 * 19818 * MIB
    assert first["gpu_power_watts"] == pytest.approx(2 * 631.95)
    assert "gpu_energy_joules_total" not in first  # no GPU had the counter
    assert (first["gpu_xid_errors_total"], first["gpu_xid_last"]) == (1.0, 79.0)
    later = {s.metric: s.value for s in engine.read() if s.text is None}
    assert later["gpu_xid_errors_total"] == 1.0 and not math.isnan(later["gpu_xid_last"])
    source.close()
