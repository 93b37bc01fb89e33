"""No orphans: every process an engine started dies with its gate, including the ones that
left its process group, and a sweep at the next start kills what a SIGKILLed gate left."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from gaterun import HIDDEN, start_gate_run

from gate.engines import keeper, launchers, orphans
from gate.engines.launchers import ProcessEngine
from gate.engines.lifecycle import Clock, PhaseLog

SLEEPER = "import time, sys; time.sleep(600)"


def _detached(tag: str, mark: str) -> subprocess.Popen[bytes]:
    """A process in a session of its own (as a TP worker that calls setsid), marked."""
    env = {**os.environ, orphans.MARK: mark}
    return subprocess.Popen([sys.executable, "-c", SLEEPER, tag], env=env, start_new_session=True)


def _gone(proc: subprocess.Popen[bytes], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        time.sleep(0.05)
    return False


# The two tests that sweep run in the serial phase (`make test`): every `gate run`, worker and
# service sweeps at its start, so one in a parallel test could take this test's orphans first.
@pytest.mark.serial
def test_the_sweep_kills_what_a_dead_owner_left_and_spares_a_live_owners(tag: str) -> None:
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner.wait()
    start = orphans.start_time(os.getpid())
    assert start is not None
    ns = orphans.pid_namespace()
    orphan = _detached(tag, f"{ns}:{dead_owner.pid}:{start}:gate-a:reference")
    elsewhere = _detached(tag, f"{ns + 1}:{dead_owner.pid}:{start}:gate-c:reference")
    ours = _detached(tag, orphans.mark_for(f"gate-b-{tag}", "candidate"))
    try:
        time.sleep(0.3)  # exec'd, environment readable
        killed = orphans.sweep_orphans()
        assert orphan.pid in killed and _gone(orphan)
        assert ours.poll() is None, "a process of a live gate was swept"
        assert elsewhere.poll() is None, "a mark of another pid namespace was swept"
        assert orphans.kill_marked(f"gate-b-{tag}", "candidate") == [ours.pid] and _gone(ours)
    finally:
        for p in (orphan, ours, elsewhere):
            p.kill()
            p.wait()


def test_a_pid_reused_by_another_process_is_not_the_owner() -> None:
    me = os.getpid()
    start = orphans.start_time(me)
    assert start is not None
    ns = orphans.pid_namespace()
    assert orphans.Mark.parse(f"{ns}:{me}:{start}:g:reference") == orphans.Mark(
        ns, me, start, "g", "reference"
    )
    assert orphans.Mark.parse("not a mark") is None
    assert not orphans._owner_alive(orphans.Mark(ns, me, start + 1, "g", "reference"))


WRAPPER = (
    "import os, subprocess, sys; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]],"
    " start_new_session=True); "
    "os.execv(sys.executable, [sys.executable, '-m', 'simengine', '--port', sys.argv[2],"
    " '--model', sys.argv[3], '--tag', sys.argv[1]])"
)


def _wait_none(find: Callable[..., list[int]], tag: str, within_s: float) -> list[int]:
    """Waits until no process of the tag is left, keepers included; returns what is left."""
    deadline = time.monotonic() + within_s
    while find(tag, keepers=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    return find(tag, keepers=True)


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(WRAPPER, id="left-the-group"),
        # Left the group *and* cleared its environment, so no mark names it: only the keeper
        # (a subreaper) still has it in its tree.
        pytest.param(HIDDEN, id="left-the-group-and-cleared-its-environment"),
    ],
)
def test_an_engine_grandchild_that_detached_dies_at_teardown(
    tmp_path: Path, tag: str, find_processes: Callable[..., list[int]], script: str
) -> None:
    engine = ProcessEngine(
        role="candidate",
        argv_template=["python", "-c", script, tag, "{port}", "{model}"],
        model="demo-model",
        phases=PhaseLog("candidate", Clock()),
        log_path=tmp_path / "candidate.log",
        readiness_timeout_s=60,
        gate_id=f"gate-teardown-{tag}",
    )

    async def run() -> list[int]:
        await engine.start()
        try:
            return find_processes(tag)
        finally:
            await engine.stop()

    during = asyncio.run(run())
    assert len(during) >= 2, f"the engine and its detached grandchild should both run: {during}"
    if script is HIDDEN:
        assert orphans.kill_marked(f"gate-teardown-{tag}") == [], "the hidden one has no mark"
    assert _wait_none(find_processes, tag, 5) == []


# `kill -9` of `gate run` with hidden grandchildren: tests/gate/faults/test_gate_run_sigkill.py.


def test_the_keeper_exits_as_its_engine_did() -> None:
    """A crash reads the same through the keeper: the engine's exit code, or its signal."""
    for script, code in (("exit 3", 3), ("kill -SEGV $$", -signal.SIGSEGV), ("exit 0", 0)):
        proc = subprocess.run(launchers._kept(["sh", "-c", script]), check=False, timeout=30)
        assert proc.returncode == code, script
    missing = subprocess.run(launchers._kept(["/nonexistent/engine"]), check=False, timeout=30)
    assert missing.returncode == 127


@pytest.mark.serial
def test_a_sigkilled_keeper_still_leaves_nothing_the_sweep_cannot_find(
    tmp_path: Path, tag: str, find_processes: Callable[[str], list[int]]
) -> None:
    """Keeper and gate both SIGKILLed (an OOM kill of the whole cgroup's parent): the leader
    dies by its parent-death signal; marked grandchildren are the next start's sweep."""
    engine = {"command": ["python", "-c", WRAPPER, tag, "{port}", "{model}"]}
    gate = start_gate_run(tmp_path, engine, name="orphans", rate=2)
    deadline = time.monotonic() + 60
    while len(find_processes(tag)) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(find_processes(tag)) >= 4, "the gate's engines did not start"
    keepers = [pid for pid in keeper.descendants(gate.pid) if "keeper.py" in _cmdline(pid)]
    assert len(keepers) == 2, keepers
    for pid in keepers:
        os.kill(pid, signal.SIGKILL)
    gate.send_signal(signal.SIGKILL)
    gate.wait()
    time.sleep(1.0)  # the parent-death signal takes the engines' leaders
    left = find_processes(tag)
    assert len(left) == 2, f"the two detached grandchildren outlive their keepers: {left}"
    killed = orphans.sweep_orphans()  # what `gate run`, `gate worker`, `gate serve` do first
    assert set(left) <= set(killed)
    assert _wait_none(find_processes, tag, 5) == []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
