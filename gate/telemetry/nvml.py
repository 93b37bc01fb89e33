"""GPUs read through NVML (`nvidia-ml-py`, module `pynvml`): the first choice where its library
loads, since it has what nvidia-smi's query lacks (the energy counter and XID events) and costs
no process per read.

The calls and units, from nvidia-ml-py 13.615.71's pynvml.py (and NVML's API reference):
`nvmlDeviceGetHandleByIndex(i)` (the host's index, as CUDA_VISIBLE_DEVICES counts when
CUDA_DEVICE_ORDER=PCI_BUS_ID), `nvmlDeviceGetMemoryInfo(h)` (.used, .total in bytes),
`nvmlDeviceGetPowerUsage(h)` (mW), `nvmlDeviceGetTotalEnergyConsumption(h)` (mJ since the
driver loaded; Volta or newer), `nvmlDeviceGetUtilizationRates(h).gpu` (%),
`nvmlDeviceGetName`, `nvmlDeviceGetUUID`, `nvmlSystemGetDriverVersion`; XID errors are events:
`nvmlDeviceRegisterEvents(h, nvmlEventTypeXidCriticalError, set)` then
`nvmlEventSetWait_v2(set, 0)` until it raises NVML_ERROR_TIMEOUT, each event's `eventData`
being the XID and `device` its handle. A value a GPU does not support (NVMLError) is None.

This machine has no GPU: `nvmlInit` raises NVMLError_LibraryNotFound here, which `open`
turns into None (the sampler then tries nvidia-smi, then notes that no GPU is visible).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gate.core.errors import TelemetryError
from gate.telemetry.gpu import GpuReading

MAX_EVENTS_PER_READ = 64


def load() -> ModuleType | None:
    """pynvml with NVML initialised, or None where the module or its library is absent."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    module: ModuleType = pynvml
    return module


def _opt_text(value: Any) -> str | None:
    """NVML's strings (bytes in older bindings, str in newer), None kept."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class NvmlSource:
    """The GPUs `indices` of this host through an initialised `nvml` module (pynvml)."""

    indices: Collection[int]
    nvml: Any
    name: str = "nvml"
    _handles: dict[int, Any] = field(default_factory=dict)
    _events: Any = None

    @classmethod
    def open(cls, indices: Collection[int]) -> NvmlSource | None:
        nvml = load()
        return cls(indices, nvml) if nvml is not None else None

    def _maybe(self, call: Callable[..., Any], *args: Any) -> Any:
        """call(*args), or None where NVML raises (a value the GPU does not support)."""
        try:
            return call(*args)
        except self.nvml.NVMLError:
            return None

    def _handles_now(self) -> dict[int, Any]:
        if not self._handles:
            try:
                self._handles = {
                    i: self.nvml.nvmlDeviceGetHandleByIndex(i) for i in sorted(self.indices)
                }
            except self.nvml.NVMLError as exc:
                raise TelemetryError(
                    f"NVML could not open GPU(s) {sorted(self.indices)}: {exc}"
                ) from exc
            self._events = self._maybe(self.nvml.nvmlEventSetCreate)
            for h in self._handles.values():
                if self._events is not None:
                    self._maybe(
                        self.nvml.nvmlDeviceRegisterEvents,
                        h,
                        self.nvml.nvmlEventTypeXidCriticalError,
                        self._events,
                    )
        return self._handles

    def _xids(self, handles: dict[int, Any]) -> dict[int, list[int]]:
        """XID events waiting in the set, by GPU index (none waits: NVML_ERROR_TIMEOUT)."""
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        uuid_of = {i: self._maybe(self.nvml.nvmlDeviceGetUUID, h) for i, h in handles.items()}
        for _ in range(MAX_EVENTS_PER_READ):
            event = self._maybe(self.nvml.nvmlEventSetWait_v2, self._events, 0)
            if event is None:
                break
            uuid = self._maybe(self.nvml.nvmlDeviceGetUUID, event.device)
            index = next((i for i, u in uuid_of.items() if u is not None and u == uuid), None)
            if index is not None:
                out.setdefault(index, []).append(int(event.eventData))
        return out

    def read(self) -> Sequence[GpuReading]:
        nvml = self.nvml
        handles = self._handles_now()
        driver = self._maybe(nvml.nvmlSystemGetDriverVersion)
        xids = self._xids(handles)
        out = []
        for index, h in handles.items():
            memory = self._maybe(nvml.nvmlDeviceGetMemoryInfo, h)
            power_mw = self._maybe(nvml.nvmlDeviceGetPowerUsage, h)
            energy_mj = self._maybe(nvml.nvmlDeviceGetTotalEnergyConsumption, h)
            util = self._maybe(nvml.nvmlDeviceGetUtilizationRates, h)
            out.append(
                GpuReading(
                    index=index,
                    uuid=_opt_text(self._maybe(nvml.nvmlDeviceGetUUID, h)),
                    name=_opt_text(self._maybe(nvml.nvmlDeviceGetName, h)),
                    driver=_opt_text(driver),
                    memory_used_bytes=float(memory.used) if memory is not None else None,
                    memory_total_bytes=float(memory.total) if memory is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    energy_j=energy_mj / 1000.0 if energy_mj is not None else None,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    xids=tuple(xids.get(index, ())),
                )
            )
        return out

    def close(self) -> None:
        if self._events is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()
