"""How busy the gate host's CPUs were over an interval, and how long its tasks waited for one,
from the kernel's own counters.

Why: a capacity search (gate/runs/capacity.py) compares the highest rate each engine sustains.
That comparison assumes each engine has its own compute. Engines started as processes on the
gate's host without GPUs (a CPU build of vLLM, llama.cpp) share its CPUs with each other and
with the load generator: near a knee one engine takes the CPU the other needs, and identical
servers measured capacities up to twice apart on a two-core host (docs/calibration.md,
"Capacity on real vLLM"). The gate cannot give them separate CPUs after the fact, but it can
measure whether tasks queued for the CPUs: the judge (gate/analysis/capacity.py) calls a search
whose knee steps ran under CPU contention undecided, and says why.

Two measures, each over the same interval:

* **Stall** (pressure stall information, PSI: Documentation/accounting/psi.rst in the Linux
  tree): the share of wall time in which at least one runnable task of the gate's cgroup (its
  `cpu.pressure`, cgroup v2), else of the whole host (`/proc/pressure/cpu`), waited for a CPU
  (the `some` line's `total`, microseconds). This is contention itself: an engine that keeps
  its own cores busy, with no more runnable threads than cores, stalls nobody; two engines on
  the same cores stall each other. Kernels since 4.20 have it, unless built or booted without.
* **Busy**: the share of the CPUs this process may use that was busy. With a cgroup v2 CPU
  quota (`cpu.max` other than `max`, the tightest of the gate's cgroup and its parents), the
  cgroup's `usage_usec` against wall time x its CPUs (quota / period, at most those it may run
  on); else `/proc/stat`'s per-CPU lines of the CPUs in `sched_getaffinity`: busy = user +
  nice + system + irq + softirq + steal (the hypervisor's steal was not ours), of busy + idle
  + iowait (guest time is inside user and nice, proc(5)). Where /proc/stat numbers CPUs its
  own way (LXCFS), its aggregate line.

Two more serve startup (gate/analysis/engines.py), over an engine's launch:

* **Others' busy share**: the share of the CPUs that work other than the gate's engines kept
  busy. The busy CPU time above, less the CPU time of the engines' own process trees
  (`tree_uses`: utime + stime + cutime + cstime of each live process below an engine's pids,
  /proc/PID/stat fields 14-17, proc(5); a reaped child's time is in its parent's cutime and
  cstime), over the CPU time available. An engine that burns every core while it compiles is
  not "others".
* **The longest run-queue wait** of any one thread of the engine's trees (`longest_wait_s`:
  the second field of /proc/PID/task/TID/schedstat, Documentation/scheduler/sched-stats.rst):
  how long the engine was ready to run but had no CPU, which bounds how much of a phase's
  time contention can explain. Busy work at the lowest priority (nice 19) makes the host
  busy but the engine hardly waits.

With a cgroup CPU quota (or LXCFS), only the gate's own cgroup is read: other tenants of the
host are not seen, and the busy share reads low (no excuse is made).

What cannot be read is None (not Linux, no PSI, unreadable files): no measurement, no guard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CpuReading",
    "HostCpu",
    "TreeUse",
    "busy_share",
    "longest_wait_s",
    "others_busy_share",
    "own_cgroup",
    "parse_cgroup_max",
    "parse_pressure",
    "parse_proc_stat",
    "parse_schedstat",
    "stall_share",
    "thread_waits",
    "tree_cpu_s",
    "tree_uses",
]

# /proc/stat's columns after the name (proc(5)): user nice system idle iowait irq softirq steal
_BUSY = (0, 1, 2, 5, 6, 7)
_IDLE = (3, 4)
# /proc/PID/stat's fields after the command's closing parenthesis start at field 3 (state):
# utime, stime, cutime, cstime are fields 14-17, so 11-14 here; ppid (field 4) is 1.
_PID_CPU = slice(11, 15)
try:
    CLOCK_TICKS = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # not POSIX
    CLOCK_TICKS = 100.0


@dataclass(frozen=True, slots=True)
class CpuReading:
    """The counters at one instant (`clock`, seconds): `busy` and `total` in the unit of
    `source` ("proc": clock ticks of both; "cgroup": seconds used, and `total` the CPUs the
    quota allows, a rate), `stall` the PSI `some` total in seconds (None: no PSI). Only the
    differences between two readings mean anything."""

    clock: float
    busy: float | None = None
    total: float | None = None
    source: str = ""
    stall: float | None = None


def parse_proc_stat(text: str, cpus: Collection[int] | None = None) -> tuple[float, float]:
    """(busy, total) ticks summed over the per-CPU lines of `cpus` (all when None); the
    aggregate `cpu` line when there are no per-CPU lines, or when they do not number the CPUs
    as `cpus` does (LXCFS renumbers a container's CPUs from 0). Raises ValueError when there
    is no line at all: a caller must not read an empty share as an idle host."""
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
    mine = [(b, t) for n, b, t in per_cpu if cpus is None or n in cpus]
    if per_cpu and (cpus is None or len(mine) == len(cpus)):
        return sum(b for b, _ in mine), sum(t for _, t in mine)
    if aggregate is None:
        raise ValueError("/proc/stat has no line for the CPUs this process may run on")
    return aggregate


def parse_cgroup_max(text: str) -> float | None:
    """The CPUs a cgroup v2 `cpu.max` ("quota period", or "max period") allows; None: no
    quota."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = float(parts[1]) if len(parts) > 1 else 100_000.0
    return float(parts[0]) / period


def parse_pressure(text: str) -> float:
    """The `some` line's total of a PSI file, in seconds."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "some":
            for field in rest.split():
                key, _, value = field.partition("=")
                if key == "total":
                    return float(value) / 1e6
    raise ValueError("no 'some ... total=' in the pressure file")


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """This process's cgroup v2 path ("0::/a/b" -> "a/b"; "" for the root), or None when it
    has no v2 cgroup (cgroup v1 only)."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip().strip("/")
    return None


def _usage_s(stat_text: str) -> float:
    for line in stat_text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return float(value) / 1e6
    raise ValueError("cpu.stat has no usage_usec")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class HostCpu:
    """Reads the counters (module docstring); `read()` never raises."""

    def __init__(
        self,
        proc: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc, self.root, self.clock = proc, cgroup_root, clock
        try:
            self.cpus: frozenset[int] | None = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            self.cpus = None
        rel = own_cgroup(_read(proc / "self" / "cgroup") or "")
        self.cgroup = None if rel is None else cgroup_root / rel if rel else cgroup_root

    def _chain(self) -> list[Path]:
        """The gate's cgroup and its parents up to the root."""
        if self.cgroup is None:
            return []
        chain, here = [self.cgroup], self.cgroup
        while here != self.root and self.root in here.parents:
            here = here.parent
            chain.append(here)
        return chain

    def _quota(self) -> tuple[float, Path] | None:
        """The tightest quota over the chain, in CPUs, and the cgroup whose usage to read."""
        quotas = []
        for cg in self._chain():
            text = _read(cg / "cpu.max")
            try:
                q = parse_cgroup_max(text) if text is not None else None
            except (ValueError, IndexError):
                q = None
            if q is not None:
                quotas.append(q)
        if not quotas or self.cgroup is None:
            return None
        quota = min(quotas)
        return (min(quota, float(len(self.cpus))) if self.cpus else quota), self.cgroup

    def _busy(self) -> tuple[float, float, str] | None:
        try:
            quota = self._quota()
            if quota is not None:
                stat = _read(quota[1] / "cpu.stat")
                if stat is not None:
                    return _usage_s(stat), quota[0], "cgroup"
            text = _read(self.proc / "stat")
            if text is None:
                return None
            busy, total = parse_proc_stat(text, self.cpus)
            return busy, total, "proc"
        except ValueError:
            return None

    def _stall(self) -> float | None:
        for path in (
            *([self.cgroup / "cpu.pressure"] if self.cgroup is not None else []),
            self.proc / "pressure" / "cpu",
        ):
            text = _read(path)
            if text is not None:
                try:
                    return parse_pressure(text)
                except ValueError:
                    continue
        return None

    def read(self) -> CpuReading:
        busy = self._busy()
        clock = self.clock()
        if busy is None:
            return CpuReading(clock, stall=self._stall())
        return CpuReading(clock, busy[0], busy[1], busy[2], self._stall())


def busy_share(before: CpuReading | None, after: CpuReading | None) -> float | None:
    """The share of the available CPU time that was busy between two readings (0 to 1), or
    None when either is missing, they come from different sources, or no time passed."""
    if before is None or after is None or before.source != after.source or not after.source:
        return None
    assert before.busy is not None and after.busy is not None
    assert before.total is not None and after.total is not None
    if after.source == "cgroup":  # seconds used against the quota's CPUs x the time between
        available = (after.clock - before.clock) * after.total
    else:
        available = after.total - before.total
    if available <= 0:
        return None
    return min(max((after.busy - before.busy) / available, 0.0), 1.0)


def stall_share(before: CpuReading | None, after: CpuReading | None) -> float | None:
    """The share of the wall time between two readings in which some task waited for a CPU
    (0 to 1), or None without PSI on both."""
    if before is None or after is None or before.stall is None or after.stall is None:
        return None
    elapsed = after.clock - before.clock
    if elapsed <= 0:
        return None
    return min(max((after.stall - before.stall) / elapsed, 0.0), 1.0)


def parse_pid_stat(text: str) -> tuple[int, float]:
    """(ppid, utime + stime + cutime + cstime in clock ticks) from one /proc/PID/stat line.
    The command name may hold spaces and parentheses: fields are read after the last ')'."""
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < _PID_CPU.stop:
        raise ValueError("a /proc/PID/stat line too short for its CPU times")
    return int(fields[1]), sum(float(x) for x in fields[_PID_CPU])


def parse_schedstat(text: str) -> float:
    """A task's run-queue wait so far, in seconds: the second field of /proc/PID/schedstat
    ("time on CPU, time waiting on a run queue, timeslices", nanoseconds;
    Documentation/scheduler/sched-stats.rst)."""
    fields = text.split()
    if len(fields) < 2:
        raise ValueError("a schedstat line without its run-queue wait")
    return float(fields[1]) / 1e9


@dataclass(frozen=True, slots=True)
class TreeUse:
    """Process trees at one instant: `cpu_s`, the CPU seconds their processes used so far
    (module docstring), and `waits`, each live thread's run-queue wait so far in seconds (by
    thread id, from /proc/PID/task/TID/schedstat; empty where the kernel keeps no
    schedstats)."""

    cpu_s: float = 0.0
    waits: Mapping[int, float] = field(default_factory=dict)


def _proc_table(proc: Path) -> dict[int, tuple[int, float]]:
    """pid -> (ppid, CPU ticks) of every process readable now."""
    table: dict[int, tuple[int, float]] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        text = _read(proc / entry / "stat")
        if text is None:
            continue
        try:
            table[int(entry)] = parse_pid_stat(text)
        except ValueError:
            continue
    return table


def _below(roots: Iterable[int], table: Mapping[int, tuple[int, float]]) -> list[int]:
    """The roots that are alive and every live process below them, each once."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(seen)


def thread_waits(pid: int, proc: Path = Path("/proc")) -> dict[int, float]:
    """Each live thread of `pid`: its run-queue wait so far, seconds (empty: not readable)."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(proc / str(pid) / "task")
    except OSError:
        return out
    for tid in tids:
        text = _read(proc / str(pid) / "task" / tid / "schedstat")
        if text is None or not tid.isdigit():
            continue
        try:
            out[int(tid)] = parse_schedstat(text)
        except ValueError:
            continue
    return out


def tree_uses(
    roots: Mapping[str, Iterable[int]], proc: Path = Path("/proc"), *, root_waits: bool = True
) -> dict[str, TreeUse]:
    """Each named set of root pids' trees, from one scan of `proc`: a name whose roots are all
    gone (or never started) gets an empty TreeUse. `root_waits=False` leaves the roots' own
    threads out of the waits (an engine's keeper: its polling is not the engine's startup)."""
    table = _proc_table(proc)
    out: dict[str, TreeUse] = {}
    for name, pids in roots.items():
        pids = list(pids)
        members = _below(pids, table)
        skip = set() if root_waits else set(pids)
        waits: dict[int, float] = {}
        for pid in members:
            if pid not in skip:
                waits.update(thread_waits(pid, proc))
        out[name] = TreeUse(sum(table[p][1] for p in members) / CLOCK_TICKS, waits)
    return out


def tree_cpu_s(root: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds used so far by `root` and every live process below it (module docstring);
    None when `root` cannot be read (gone, or not Linux)."""
    table = _proc_table(proc)
    if root not in table:
        return None
    return sum(table[p][1] for p in _below([root], table)) / CLOCK_TICKS


def longest_wait_s(before: TreeUse, after: TreeUse) -> float:
    """The longest any one thread of `after` waited on a run queue since `before` (a thread
    born since counts from zero; one that ended in between is not seen)."""
    return max((w - before.waits.get(tid, 0.0) for tid, w in after.waits.items()), default=0.0)


def others_busy_share(
    before: CpuReading | None, after: CpuReading | None, own_s: float
) -> float | None:
    """The share of the available CPU time between two readings that was busy with work other
    than `own_s` CPU seconds (the engines' own), 0 to 1; None as `busy_share`."""
    share = busy_share(before, after)
    if share is None:
        return None
    assert before is not None and after is not None and after.total is not None
    assert before.total is not None
    if after.source == "cgroup":
        available = (after.clock - before.clock) * after.total
    else:
        available = (after.total - before.total) / CLOCK_TICKS
    return min(max(share - own_s / available, 0.0), 1.0)
