"""GPUs read with `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`, where NVML's
library cannot be loaded by the gate but the tool is on PATH.

The field names are nvidia-smi's own (`nvidia-smi --help-query-gpu`; the list of driver
590.48.01 on an H100, as captured in utkuozdemir/nvidia_gpu_exporter
internal/captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt lines 327-1060:
"index", "uuid", "name", "driver_version", "memory.used" and "memory.total" in MiB,
"power.draw" in W (on Ampere or newer the average over one second), "utilization.gpu" in %).
The query has no energy counter (none of its 212 fields is one), so energy is integrated from
power by the judge (gate/analysis/gpu.py), and no XID errors (NVML's events carry them).

The output is one line per GPU, the values in the order asked, separated by ", " (the same
capture, lines 1737-1741 and 2101-2105, in `--format=csv`; `nounits` drops the " MiB", " W"
and " %" after the numbers); a value the GPU does not report reads `[N/A]` or
`[Not Supported]`. tests/support/captures/nvidia-smi/ keeps those lines as fixtures.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from gate.core.errors import TelemetryError
from gate.telemetry.gpu import MIB, GpuReading, number

FIELDS = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "memory.used",
    "memory.total",
    "power.draw",
    "utilization.gpu",
)
FORMAT = "csv,noheader,nounits"
TIMEOUT_S = 10.0  # nvidia-smi answers in ~50 ms; a wedged driver can take minutes


def query_argv(program: str) -> list[str]:
    return [program, f"--query-gpu={','.join(FIELDS)}", f"--format={FORMAT}"]


def _row(cells: list[str], line_no: int) -> GpuReading:
    if len(cells) != len(FIELDS):
        raise TelemetryError(
            f"nvidia-smi line {line_no}: {len(cells)} values for the {len(FIELDS)} fields "
            f"asked ({', '.join(FIELDS)})"
        )
    values = dict(zip(FIELDS, cells, strict=True))
    index = number(values["index"])
    if index is None:
        raise TelemetryError(f"nvidia-smi line {line_no}: index {values['index']!r}")
    used, total = number(values["memory.used"]), number(values["memory.total"])
    return GpuReading(
        index=int(index),
        uuid=values["uuid"] or None,
        name=values["name"] or None,
        driver=values["driver_version"] or None,
        memory_used_bytes=used * MIB if used is not None else None,
        memory_total_bytes=total * MIB if total is not None else None,
        power_w=number(values["power.draw"]),
        utilization_pct=number(values["utilization.gpu"]),
    )


def parse_query(text: str) -> list[GpuReading]:
    """Every GPU line of `--query-gpu=FIELDS --format=csv,noheader,nounits`."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    rows = csv.reader(lines, skipinitialspace=True)
    return [_row([c.strip() for c in cells], n) for n, cells in enumerate(rows, start=1)]


@dataclass
class Query:
    """One run of nvidia-smi for every engine on this host: a source that has not yet had the
    last run's answer gets it while it is under `reuse_s` old, so the sampler's per-role reads
    of one tick cost one process, not one per engine (a process costs tens of ms of CPU); a
    source that asks again always gets a fresh run."""

    program: str
    reuse_s: float = 0.1
    _last: tuple[float, list[GpuReading]] | None = None
    _served: set[int] = field(default_factory=set)

    def run(self, reader: object) -> list[GpuReading]:
        now = time.monotonic()
        fresh = self._last is not None and now - self._last[0] < self.reuse_s
        if self._last is not None and fresh and id(reader) not in self._served:
            self._served.add(id(reader))
            return self._last[1]
        try:
            done = subprocess.run(
                query_argv(self.program),
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TelemetryError(f"nvidia-smi could not be run: {exc}") from exc
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise TelemetryError(
                f"nvidia-smi exited {done.returncode}: {why[0] if why else 'no output'}"
            )
        readings = parse_query(done.stdout)
        self._last, self._served = (time.monotonic(), readings), {id(reader)}
        return readings


def find_query() -> Query | None:
    """nvidia-smi as found on PATH, or None."""
    program = shutil.which("nvidia-smi")
    return Query(program) if program else None


@dataclass
class NvidiaSmiSource:
    """The GPUs `indices` of this host, from a (shared) nvidia-smi query."""

    indices: Collection[int]
    query: Query
    name: str = "nvidia-smi"

    def read(self) -> Sequence[GpuReading]:
        wanted = set(self.indices)
        return [r for r in self.query.run(self) if r.index in wanted]

    def close(self) -> None:
        return None
