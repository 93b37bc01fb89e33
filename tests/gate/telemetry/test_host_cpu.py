"""The gate host's CPU counters (gate/telemetry/host_cpu.py): /proc/stat's columns as proc(5)
defines them, the CPUs this process may run on, a cgroup v2 quota (the tightest up the
gate's cgroup's parents) before the host's counters, PSI's `some` total as
Documentation/accounting/psi.rst gives it, and None (no guard) rather than a made-up idle host
when nothing can be read. A process tree's CPU time from /proc/PID/stat (proc(5): utime, stime,
cutime, cstime are fields 14-17, ppid field 4, the command in parentheses may hold both), and
the share of the CPUs other work kept busy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.telemetry.host_cpu import (
    CLOCK_TICKS,
    CpuReading,
    HostCpu,
    TreeUse,
    busy_share,
    longest_wait_s,
    others_busy_share,
    own_cgroup,
    parse_cgroup_max,
    parse_pid_stat,
    parse_pressure,
    parse_proc_stat,
    parse_schedstat,
    stall_share,
    tree_cpu_s,
    tree_uses,
)

# A /proc/stat of a two-CPU host (format: proc(5), "/proc/stat": user nice system idle iowait
# irq softirq steal guest guest_nice, in USER_HZ ticks).
STAT = """cpu  300 10 100 500 40 5 5 40 0 0
cpu0 200 10 50 200 20 5 5 10 0 0
cpu1 100 0 50 300 20 0 0 30 0 0
intr 12345 0 0
ctxt 999
btime 1700000000
"""
# /proc/pressure/cpu (psi.rst: "some avg10=... total=<microseconds>"; "full" since 5.13)
PRESSURE = """some avg10=26.23 avg60=34.81 avg300=42.92 total=5526378928
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
"""


def test_busy_counts_steal_and_irqs_and_total_adds_idle_and_iowait() -> None:
    # cpu0: busy 200+10+50+5+5+10 = 280 of 280+200+20 = 500
    assert parse_proc_stat(STAT, {0}) == (280.0, 500.0)
    assert parse_proc_stat(STAT, {0, 1}) == (280.0 + 180.0, 500.0 + 500.0)
    assert parse_proc_stat(STAT, None) == (460.0, 1000.0)


def test_only_the_cpus_this_process_may_run_on_else_the_aggregate() -> None:
    assert parse_proc_stat(STAT, {1}) == (180.0, 500.0)
    # CPUs numbered otherwise (LXCFS renumbers a container's from 0): the aggregate line
    assert parse_proc_stat(STAT, {6, 7}) == (460.0, 1000.0)
    with pytest.raises(ValueError, match="no line"):
        parse_proc_stat("cpu3 1 1 1 1\n", {7})


def test_old_kernels_without_irq_or_steal_columns_and_the_aggregate_alone() -> None:
    assert parse_proc_stat("cpu0 10 0 10 80 0\n", None) == (20.0, 100.0)
    assert parse_proc_stat("cpu  10 0 10 80 0 0 0 0\n", {0}) == (20.0, 100.0)
    with pytest.raises(ValueError, match="no line"):
        parse_proc_stat("intr 1\n", None)


def test_quota_pressure_and_cgroup_path_parsing() -> None:
    assert parse_cgroup_max("150000 100000\n") == 1.5
    assert parse_cgroup_max("max 100000\n") is None
    assert parse_cgroup_max("") is None
    assert parse_pressure(PRESSURE) == pytest.approx(5526.378928)
    with pytest.raises(ValueError, match="some"):
        parse_pressure("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert own_cgroup("0::/system.slice/gate.service\n") == "system.slice/gate.service"
    assert own_cgroup("12:cpu,cpuacct:/x\n0::/\n") == ""
    assert own_cgroup("4:memory:/x\n1:cpu:/\n") is None  # cgroup v1 only


def fake_host(tmp: Path, cgroup: str, clock: list[float]) -> tuple[HostCpu, Path]:
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "pressure").mkdir()
    (proc / "stat").write_text(STAT)
    (proc / "pressure" / "cpu").write_text(PRESSURE)
    (proc / "self" / "cgroup").write_text(cgroup)
    root = tmp / "cg"
    root.mkdir()
    return HostCpu(proc, root, clock=lambda: clock[0]), root


def test_the_tightest_quota_up_the_chain_is_read_before_the_hosts_counters(
    tmp_path: Path,
) -> None:
    clock = [10.0]
    host, root = fake_host(tmp_path, "0::/pods/gate\n", clock)
    own = root / "pods" / "gate"
    own.mkdir(parents=True)
    (own / "cpu.max").write_text("max 100000\n")
    (root / "pods" / "cpu.max").write_text("50000 100000\n")  # half a CPU, on the parent
    (own / "cpu.stat").write_text("usage_usec 4000000\nuser_usec 1\nsystem_usec 1\n")
    (own / "cpu.pressure").write_text("some avg10=0 avg60=0 avg300=0 total=2000000\n")
    first = host.read()
    assert (first.source, first.busy, first.total, first.stall) == ("cgroup", 4.0, 0.5, 2.0)
    clock[0] = 12.0
    (own / "cpu.stat").write_text("usage_usec 4900000\n")
    (own / "cpu.pressure").write_text("some avg10=0 avg60=0 avg300=0 total=2500000\n")
    second = host.read()
    assert busy_share(first, second) == pytest.approx(0.9 / (2.0 * 0.5))  # 0.9 s of 1 CPU-s
    assert stall_share(first, second) == pytest.approx(0.25)  # the cgroup's own pressure


def test_without_a_quota_proc_stat_and_the_hosts_pressure(tmp_path: Path) -> None:
    host, _ = fake_host(tmp_path, "4:memory:/x\n", [1.0])  # cgroup v1: no v2 path
    host.cpus = frozenset({0})
    got = host.read()
    assert (got.source, got.busy, got.total) == ("proc", 280.0, 500.0)
    assert got.stall == pytest.approx(5526.378928)
    nothing = HostCpu(tmp_path / "missing", tmp_path / "nothing").read()
    assert nothing.source == "" and nothing.busy is None and nothing.stall is None
    assert busy_share(nothing, nothing) is None and stall_share(nothing, nothing) is None


def test_the_shares_between_two_readings() -> None:
    a, b = CpuReading(1.0, 100, 1000, "proc", 3.0), CpuReading(3.0, 190, 1100, "proc", 3.5)
    assert busy_share(a, b) == pytest.approx(0.9)
    assert stall_share(a, b) == pytest.approx(0.25)
    assert busy_share(a, None) is None and stall_share(None, b) is None
    assert busy_share(a, CpuReading(3.0, 190, 1.0, "cgroup")) is None  # units differ
    assert busy_share(a, a) is None and stall_share(a, a) is None  # no time passed
    assert busy_share(a, CpuReading(3.0, 300, 1100, "proc")) == 1.0  # clamped


def test_this_host_is_read() -> None:
    # Linux (CI's machine): a real reading whose counters do not go backwards.
    host = HostCpu()
    first, second = host.read(), host.read()
    assert first.busy is not None and second.busy is not None
    assert first.total is not None and second.total is not None
    assert second.busy >= first.busy and second.total >= first.total


def _pid_stat(pid: int, comm: str, ppid: int, cpu: tuple[int, int, int, int]) -> str:
    # fields 1-17 of proc(5)'s /proc/PID/stat, then the rest as a real line has them
    utime, stime, cutime, cstime = cpu
    middle = f"S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0"
    return f"{pid} ({comm}) {middle} {utime} {stime} {cutime} {cstime} 20 0 1 0 100 0 0\n"


def test_a_pid_stat_line_whose_command_holds_spaces_and_parentheses() -> None:
    line = _pid_stat(42, "vllm (worker) 1", 7, (300, 100, 50, 25))
    assert parse_pid_stat(line) == (7, 475.0)
    with pytest.raises(ValueError, match="too short"):
        parse_pid_stat("42 (x) S 7 42")


def test_a_tree_sums_every_live_process_below_its_root(tmp_path: Path) -> None:
    tree = {10: (1, (100, 50, 30, 20)), 11: (10, (40, 10, 0, 0)), 12: (11, (5, 5, 0, 0))}
    tree[13] = (1, (999, 999, 0, 0))  # another program: not the engine's
    for pid, (ppid, cpu) in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(_pid_stat(pid, "python3", ppid, cpu))
    (tmp_path / "self").mkdir()  # not a pid
    assert tree_cpu_s(10, tmp_path) == pytest.approx(260.0 / CLOCK_TICKS)
    assert tree_cpu_s(11, tmp_path) == pytest.approx(60.0 / CLOCK_TICKS)
    assert tree_cpu_s(99, tmp_path) is None  # gone
    assert tree_cpu_s(10, tmp_path / "missing") is None
    # Threads' run-queue waits (sched-stats.rst: "time spent waiting on a runqueue", ns).
    for pid, tid, wait_ns in ((10, 10, 2_000_000_000), (10, 20, 500_000_000), (12, 12, 10**9)):
        task = tmp_path / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "schedstat").write_text(f"123456789 {wait_ns} 42\n")
    uses = tree_uses({"candidate": [11], "both": [10, 11], "gone": [99], "none": []}, tmp_path)
    assert uses["candidate"] == TreeUse(60.0 / CLOCK_TICKS, {12: 1.0})
    assert uses["both"].cpu_s == pytest.approx(260.0 / CLOCK_TICKS)  # 11 counted once
    assert uses["both"].waits == {10: 2.0, 20: 0.5, 12: 1.0}
    assert uses["gone"] == uses["none"] == TreeUse()
    # an engine's keeper (the root) polls: its own threads are left out when asked
    assert tree_uses({"both": [10, 11]}, tmp_path, root_waits=False)["both"].waits == {12: 1.0}
    # The longest wait since a mark: a thread seen then counts from there, a new one from 0.
    later = TreeUse(0.0, {10: 2.25, 20: 1.5, 12: 1.0, 30: 0.75})
    assert longest_wait_s(uses["both"], later) == pytest.approx(1.0)
    assert longest_wait_s(TreeUse(), TreeUse()) == 0.0
    assert parse_schedstat("1 2500000000 3") == 2.5
    with pytest.raises(ValueError, match="run-queue"):
        parse_schedstat("1")


def test_others_share_leaves_out_the_engines_own_cpu_time() -> None:
    # /proc/stat: 2 s of two CPUs (4 CPU-seconds), 3.6 of them busy; the engine used 2 of them.
    a = CpuReading(0.0, 0.0, 0.0, "proc")
    b = CpuReading(2.0, 3.6 * CLOCK_TICKS, 4.0 * CLOCK_TICKS, "proc")
    assert busy_share(a, b) == pytest.approx(0.9)
    assert others_busy_share(a, b, 2.0) == pytest.approx(0.4)
    assert others_busy_share(a, b, 9.0) == 0.0  # clamped (a tree read a little late)
    # A cgroup quota of 1.5 CPUs: seconds used against 1.5 x 2 s.
    c, d = CpuReading(0.0, 10.0, 1.5, "cgroup"), CpuReading(2.0, 12.7, 1.5, "cgroup")
    assert others_busy_share(c, d, 0.3) == pytest.approx(0.8)
    assert others_busy_share(a, CpuReading(2.0, 1.0, 1.5, "cgroup"), 0.0) is None


_BURN = """
import os, sys, time
burn = float(sys.argv[1])
if sys.argv[2] == "fork":
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", sys.argv[3], sys.argv[1], "leaf", ""])
while time.process_time() < burn:
    pass
print("burnt", flush=True)
time.sleep(60)
"""


def _burner(seconds: float, fork: bool) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", _BURN, str(seconds), "fork" if fork else "leaf", _BURN]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def test_a_real_tree_and_the_host_it_kept_busy() -> None:
    # A parent and its child each burn 0.3 s of CPU, however long a busy machine takes to
    # give it to them; the tree's time is at least both.
    parent = _burner(0.3, fork=True)
    try:
        assert parent.stdout is not None
        lines = [parent.stdout.readline(), parent.stdout.readline()]
        assert lines == ["burnt\n", "burnt\n"], lines
        got = tree_cpu_s(parent.pid)
        assert got is not None and got >= 0.6 - 2.0 / CLOCK_TICKS
        (use,) = tree_uses({"p": [parent.pid]}).values()
        assert use.cpu_s == pytest.approx(got, abs=0.05) and len(use.waits) >= 2  # 2 processes
    finally:
        parent.kill()
        parent.wait()
    # One burner more than this process may use CPUs: they wait for one another, and counted
    # as other work they fill the host.
    host = HostCpu()
    n = len(os.sched_getaffinity(0))
    before = host.read()
    burners = [_burner(0.5, fork=False) for _ in range(n + 1)]
    start = tree_uses({str(i): [b.pid] for i, b in enumerate(burners)})
    try:
        for b in burners:
            assert b.stdout is not None and b.stdout.readline() == "burnt\n"
        after = host.read()
        end = tree_uses({str(i): [b.pid] for i, b in enumerate(burners)})
    finally:
        for b in burners:
            b.kill()
            b.wait()
    # n + 1 tasks of 0.5 s on n CPUs wait for one another: about 0.5 s in all when they start
    # together (1.1 s each here, with a CI run beside them), less as their starts spread out
    waited = [longest_wait_s(start[str(i)], end[str(i)]) for i in range(n + 1)]
    assert sum(waited) >= 0.2, waited
    others = others_busy_share(before, after, 0.0)
    assert others is not None and others >= 0.5, others
    # Counted as the engines' own (each burnt its 0.5 s), they are no longer others' work.
    own = sum(u.cpu_s for u in end.values())
    assert own >= (n + 1) * (0.5 - 2.0 / CLOCK_TICKS)
    mine = others_busy_share(before, after, own)
    assert mine is not None and mine < others
