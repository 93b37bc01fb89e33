"""One GPU as every GPU tool is read: a `GpuReading` in one set of units, and the shape of a
tool's reader (`GpuSource`).

A GPU source reads the GPUs it was given (by index on a host: the CUDA_VISIBLE_DEVICES the gate
gave an engine, gate/engines/launchers.py) and returns one `GpuReading` per GPU, in one set of
units whatever the tool spoke: bytes of memory, watts, joules since some fixed origin (a
counter; None where the tool has none: nvidia-smi's query has no energy field, so energy is
then integrated from power), percent, and the XID errors seen since the last read.
gpu_sources.py turns an engine's readings into the sampler's `Sample`s (the vocabulary's
`gpu_*` names, summed over the engine's GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one read. `index` is the host's index (what CUDA_VISIBLE_DEVICES names),
    `xids` the XID error codes reported since the previous read."""

    index: int
    uuid: str | None = None
    name: str | None = None
    driver: str | None = None
    host: str | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_w: float | None = None
    energy_j: float | None = None
    utilization_pct: float | None = None
    xids: tuple[int, ...] = ()


class GpuSource(Protocol):
    """Something that reads a fixed set of GPUs: `name` says which tool (for the document),
    `read` returns one reading per GPU it could read (blocking: the sampler calls it off the
    event loop) and raises `TelemetryError` when the tool answered nothing usable."""

    @property
    def name(self) -> str: ...

    def read(self) -> Sequence[GpuReading]: ...

    def close(self) -> None: ...


def number(text: str | None) -> float | None:
    """A tool's value as a float; None for the placeholders tools print when a value is not
    available ('[N/A]', '[Not Supported]', 'N/A', '', '[Requested functionality has been
    deprecated]' in nvidia-smi's CSV)."""
    if text is None:
        return None
    t = text.strip()
    if not t or t.startswith("[") or t.upper() == "N/A":
        return None
    try:
        return float(t)
    except ValueError:
        return None
