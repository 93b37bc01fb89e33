"""The gate host's CPU share (gate/telemetry/host_cpu.py): /proc/stat's columns as proc(5)
defines them, the CPUs this process may run on, a cgroup v2 quota before the host's counters,
and None (no guard) rather than a made-up idle host when nothing can be read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gate.telemetry.host_cpu import (
    CpuReading,
    HostCpu,
    busy_share,
    parse_cgroup_max,
    parse_proc_stat,
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


def test_busy_counts_steal_and_irqs_and_total_adds_idle_and_iowait() -> None:
    # cpu0: busy 200+10+50+5+5+10 = 280 of 280+200+20 = 500
    assert parse_proc_stat(STAT, {0}) == (280.0, 500.0)
    assert parse_proc_stat(STAT, {0, 1}) == (280.0 + 180.0, 500.0 + 500.0)
    assert parse_proc_stat(STAT, None) == (460.0, 1000.0)


def test_only_the_cpus_this_process_may_run_on() -> None:
    assert parse_proc_stat(STAT, {1}) == (180.0, 500.0)
    with pytest.raises(ValueError, match="may run on"):
        parse_proc_stat(STAT, {7})


def test_old_kernels_without_irq_or_steal_columns_and_the_aggregate_alone() -> None:
    assert parse_proc_stat("cpu0 10 0 10 80 0\n", None) == (20.0, 100.0)
    assert parse_proc_stat("cpu  10 0 10 80 0 0 0 0\n", {0}) == (20.0, 100.0)
    with pytest.raises(ValueError, match="no cpu line"):
        parse_proc_stat("intr 1\n", None)


def test_a_cgroup_quota_is_read_as_cpus() -> None:
    assert parse_cgroup_max("150000 100000\n") == 1.5
    assert parse_cgroup_max("max 100000\n") is None
    assert parse_cgroup_max("") is None


def fake_host(tmp: Path, stat: str, cpu_max: str | None, usage_usec: int = 0) -> HostCpu:
    (tmp / "stat").write_text(stat)
    cg = tmp / "cgroup"
    cg.mkdir(exist_ok=True)
    if cpu_max is not None:
        (cg / "cpu.max").write_text(cpu_max)
        (cg / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 1\n")
    return HostCpu(tmp / "stat", cg, clock=lambda: 10.0)


def test_a_quota_is_preferred_to_the_hosts_counters(tmp_path: Path) -> None:
    host = fake_host(tmp_path, STAT, "100000 100000", usage_usec=4_000_000)
    got = host.read()
    assert got is not None and got.source == "cgroup"
    # 4 s used; 10 s of the clock at one CPU (a quota of one CPU, at most the CPUs it may use)
    assert (got.busy, got.total) == (4.0, 10.0 * min(1.0, len(os.sched_getaffinity(0))))


def test_no_quota_reads_proc_stat_and_unreadable_reads_none(tmp_path: Path) -> None:
    host = fake_host(tmp_path, STAT, "max 100000")
    host.cpus = frozenset({0})
    assert host.read() == CpuReading(280.0, 500.0, "proc")
    broken = HostCpu(tmp_path / "missing", tmp_path / "nothing")
    assert broken.read() is None


def test_the_share_between_two_readings() -> None:
    a, b = CpuReading(100, 1000, "proc"), CpuReading(190, 1100, "proc")
    assert busy_share(a, b) == pytest.approx(0.9)
    assert busy_share(a, None) is None and busy_share(None, b) is None
    assert busy_share(a, CpuReading(190, 1100, "cgroup")) is None  # units differ
    assert busy_share(a, a) is None  # no time passed
    assert busy_share(a, CpuReading(300, 1100, "proc")) == 1.0  # clamped (a quota overrun)


def test_this_host_is_read() -> None:
    # Linux (CI's machine): a real reading whose counters do not go backwards.
    host = HostCpu()
    first, second = host.read(), host.read()
    assert first is not None and second is not None
    assert second.busy >= first.busy and second.total >= first.total
