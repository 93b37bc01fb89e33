"""The engines' GPUs as sources of the sampler (sampler.py): which tool reads which engine's
reserved GPUs, and an engine's readings as samples in the vocabulary (vocabulary.py `gpu_*`).

`choose_sources`, once per gate: a process engine's GPUs through NVML where its library loads,
else nvidia-smi where it is on PATH (the `GATE_GPU_TELEMETRY` setting may name one, or `off`);
a Kubernetes engine's through the DCGM exporter at `GATE_DCGM_URL`; an attached engine has no
GPUs of the gate's. Where nothing can read them, one note says why (the scenario's document
keeps it, `TelemetryDoc.gpu_note`) and the gate carries on without GPU checks. The GPU sources
live for the whole gate (NVML's event set, DCGM's XID baseline, one nvidia-smi query shared by
both engines) and are closed at teardown.

`EngineGpuSource`, once per scenario per engine: each read sums the engine's GPUs (memory,
power, the energy counter where every GPU has one; utilisation averaged), counts the XID
errors reported since the scenario started and keeps the last code, and states the GPUs'
model, driver and count as configuration (the engine card shows them). A read that fails
raises, which the sampler records as a gap.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gate.core.errors import TelemetryError
from gate.telemetry.dcgm import DcgmSource
from gate.telemetry.gpu import GpuReading, GpuSource
from gate.telemetry.nvidia_smi import NvidiaSmiSource, Query, find_query
from gate.telemetry.nvml import NvmlSource
from gate.telemetry.source import Sample

__all__ = ["Backend", "Chosen", "EngineGpuSource", "EngineGpus", "choose_sources"]

Backend = Literal["auto", "nvml", "nvidia-smi", "off"]
Runtime = Literal["process", "endpoint", "kubernetes"]


@dataclass(frozen=True)
class EngineGpus:
    """An engine as telemetry needs it: how it runs and its GPUs, (node, indices) per worker."""

    runtime: Runtime
    workers: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass
class Chosen:
    """The GPU source of each role that has one, and why the others have none."""

    sources: dict[str, GpuSource] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        for s in self.sources.values():
            with contextlib.suppress(Exception):
                s.close()


def _local_source(
    indices: tuple[int, ...], backend: Backend, smi: list[Query | None]
) -> GpuSource | None:
    """NVML where allowed and loadable, else nvidia-smi (one query shared by the engines)."""
    if backend in ("auto", "nvml"):
        nvml = NvmlSource.open(indices)
        if nvml is not None or backend == "nvml":
            return nvml
    if not smi:
        smi.append(find_query())
    return NvidiaSmiSource(indices, smi[0]) if smi[0] is not None else None


def choose_sources(
    engines: Mapping[str, EngineGpus], backend: Backend, dcgm_url: str | None
) -> Chosen:
    """A source per role whose GPUs can be read, and the notes for the others."""
    chosen = Chosen()
    if backend == "off":
        chosen.notes.append(
            "GPU telemetry is off (GATE_GPU_TELEMETRY=off): GPU memory, energy per token and "
            "XID errors were not compared."
        )
        return chosen
    unseen: list[str] = []
    smi: list[Query | None] = []  # looked up once
    for role, eng in engines.items():
        indices = tuple(i for _, gpus in eng.workers for i in gpus)
        if eng.runtime == "endpoint" or not indices:
            continue
        if eng.runtime == "kubernetes":
            if dcgm_url:
                chosen.sources[role] = DcgmSource(dcgm_url, eng.workers)
            else:
                chosen.notes.append(
                    f"The {role}'s GPUs run in Kubernetes and no DCGM exporter is configured "
                    "(GATE_DCGM_URL): its GPU memory, energy and XID errors were not read."
                )
            continue
        source = _local_source(indices, backend, smi)
        if source is None:
            unseen.append(role)
        else:
            chosen.sources[role] = source
    if unseen:
        how = (
            "NVML's library could not be loaded"
            if backend == "nvml"
            else "NVML's library could not be loaded and nvidia-smi is not on PATH"
        )
        chosen.notes.append(
            f"No GPU is visible to the gate ({how}): GPU memory, energy per token and XID "
            f"errors of the {' and '.join(unseen)} were not compared."
        )
    return chosen


def _sum(values: Sequence[float | None]) -> float | None:
    """The sum, or None unless every GPU reported the value."""
    if not values or any(v is None for v in values):
        return None
    return math.fsum(v for v in values if v is not None)


@dataclass
class EngineGpuSource:
    """One engine's GPUs through one scenario, as the sampler's `Source` (module docstring)."""

    gpus: GpuSource
    xids: int = 0
    last_xid: int = 0

    @property
    def name(self) -> str:
        return f"{self.gpus.name} (GPUs)"

    def read(self) -> list[Sample]:
        readings: list[GpuReading] = list(self.gpus.read())
        if not readings:
            raise TelemetryError(f"{self.gpus.name} reported none of the engine's GPUs")
        for r in readings:
            for code in r.xids:
                self.xids += 1
                self.last_xid = code
        utils = [r.utilization_pct for r in readings if r.utilization_pct is not None]
        values = {
            "gpu_memory_used_bytes": _sum([r.memory_used_bytes for r in readings]),
            "gpu_power_watts": _sum([r.power_w for r in readings]),
            "gpu_energy_joules_total": _sum([r.energy_j for r in readings]),
            "gpu_utilization_percent": math.fsum(utils) / len(utils) if utils else None,
            "gpu_xid_errors_total": float(self.xids),
            "gpu_xid_last": float(self.last_xid),
        }
        out = [Sample(m, v) for m, v in values.items() if v is not None]
        names = sorted({r.name for r in readings if r.name})
        drivers = sorted({r.driver for r in readings if r.driver})
        config = {
            "gpu_model": " / ".join(names),
            "gpu_driver": ", ".join(drivers),
            "gpu_count": str(len(readings)),
        }
        out.extend(Sample(k, math.nan, text=v) for k, v in config.items() if v)
        return out

    def close(self) -> None:
        return None  # the GPU source outlives the scenario: teardown closes it (Chosen)
