"""How busy the gate host's CPUs were over an interval, from the kernel's own counters.

Why: a capacity search (gate/runs/capacity.py) compares the highest rate each engine sustains.
That comparison assumes each engine has its own compute. Engines started as processes on the
gate's host without GPUs (a CPU build of vLLM, llama.cpp) share its CPUs with each other and
with the load generator: near a knee one engine takes the CPU the other needs, and identical
servers measured capacities up to twice apart on a two-core host (docs/calibration.md,
"Capacity on real vLLM"). The gate cannot give them separate CPUs after the fact, but it can
measure whether the CPUs were the limit: the judge (gate/analysis/capacity.py) calls a search
whose knee steps ran on saturated CPUs undecided, and says why.

What is read, the first that applies:

1. cgroup v2 with a CPU quota (`/sys/fs/cgroup/cpu.max` other than `max`): the cgroup's
   `usage_usec` (`cpu.stat`) against wall time x its CPUs (quota / period, at most the CPUs it
   may run on). In a container the quota is what its processes may use, whatever the host's
   counters say.
2. `/proc/stat`'s per-CPU lines of the CPUs this process may run on (`sched_getaffinity`):
   busy = user + nice + system + irq + softirq + steal (the hypervisor's steal is time these
   CPUs were not ours), of busy + idle + iowait (guest time is already inside user and nice,
   proc(5)). Units are clock ticks; only the share is used.

Anything else (not Linux, unreadable files) reads as None: no measurement, no guard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuReading", "HostCpu", "busy_share", "parse_cgroup_max", "parse_proc_stat"]

# /proc/stat's columns after the name (proc(5)): user nice system idle iowait irq softirq steal
_BUSY = (0, 1, 2, 5, 6, 7)
_IDLE = (3, 4)


@dataclass(frozen=True, slots=True)
class CpuReading:
    """Cumulative busy and available CPU time at one instant, in one unit (ticks or
    seconds): only differences between two readings of the same source mean anything."""

    busy: float
    total: float
    source: str


def parse_proc_stat(text: str, cpus: Collection[int] | None = None) -> tuple[float, float]:
    """(busy, total) ticks summed over the per-CPU lines of `cpus` (all when None), or the
    aggregate `cpu` line when the text has no per-CPU lines. Raises ValueError when nothing
    matches: a caller must not read an empty share as an idle host."""
    aggregate: tuple[float, float] | None = None
    per_cpu: list[tuple[int, float, float]] = []
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu"):
            continue
        fields = [float(x) for x in rest.split()]
        fields += [0.0] * (8 - len(fields))  # old kernels: no irq, softirq, steal columns
        b = sum(fields[i] for i in _BUSY)
        t = b + sum(fields[i] for i in _IDLE)
        if name == "cpu":
            aggregate = (b, t)
        else:
            per_cpu.append((int(name[3:]), b, t))
    if not per_cpu:
        if aggregate is None:
            raise ValueError("/proc/stat has no cpu line")
        return aggregate
    mine = [(b, t) for n, b, t in per_cpu if cpus is None or n in cpus]
    if not mine:
        raise ValueError("no CPU line of /proc/stat is one this process may run on")
    return sum(b for b, _ in mine), sum(t for _, t in mine)


def parse_cgroup_max(text: str) -> float | None:
    """The CPUs a cgroup v2 `cpu.max` ("quota period", or "max period") allows; None: no
    quota."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = float(parts[1]) if len(parts) > 1 else 100_000.0
    return float(parts[0]) / period


def _usage_s(stat_text: str) -> float:
    for line in stat_text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return float(value) / 1e6
    raise ValueError("cpu.stat has no usage_usec")


class HostCpu:
    """Reads the host's CPU counters (module docstring); `read()` never raises."""

    def __init__(
        self,
        proc: Path = Path("/proc/stat"),
        cgroup: Path = Path("/sys/fs/cgroup"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc, self.cgroup, self.clock = proc, cgroup, clock
        try:
            self.cpus: frozenset[int] | None = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            self.cpus = None

    def _quota(self) -> float | None:
        try:
            quota = parse_cgroup_max((self.cgroup / "cpu.max").read_text())
        except (OSError, ValueError, IndexError):
            return None
        if quota is None:
            return None
        return min(quota, float(len(self.cpus))) if self.cpus else quota

    def read(self) -> CpuReading | None:
        try:
            quota = self._quota()
            if quota is not None:
                used = _usage_s((self.cgroup / "cpu.stat").read_text())
                return CpuReading(used, self.clock() * quota, "cgroup")
            busy, total = parse_proc_stat(self.proc.read_text(), self.cpus)
            return CpuReading(busy, total, "proc")
        except (OSError, ValueError):
            return None


def busy_share(before: CpuReading | None, after: CpuReading | None) -> float | None:
    """The share of the available CPU time that was busy between two readings (0 to 1), or
    None when either is missing, they come from different sources, or no time passed."""
    if before is None or after is None or before.source != after.source:
        return None
    total = after.total - before.total
    if total <= 0:
        return None
    return min(max((after.busy - before.busy) / total, 0.0), 1.0)
