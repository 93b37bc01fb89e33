"""Every process an engine started dies with its gate, on every path.

An engine runs under its keeper (keeper.py: a child subreaper with a parent-death signal), in
a process group of its own, killed whole at teardown; the keeper ends whatever left the group.
A keeper SIGKILLed together with its gate cannot, so every engine process also carries a mark
in its environment, inherited by all it starts (and lost only by one that clears it):

    LLM_GATE_ENGINE=<pid namespace>:<owner pid>:<owner start time>:<gate id>:<role>

Teardown kills every process marked with its gate and role (`kill_marked`), and every gate
process, worker and service sweeps at its start for marked processes whose owner is dead
(`sweep_orphans`): the owner's pid and start time (from /proc) name it even if the pid was
reused. A sweep looks only at marks of its own pid namespace: a pid means nothing in another
(a root sweeper on the host would otherwise take a container's live engines for orphans).
Linux only (/proc); elsewhere both find nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gate.engines")

MARK = "LLM_GATE_ENGINE"  # not GATE_*: engines never inherit the service's own settings
PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Mark:
    pid_ns: int
    owner_pid: int
    owner_start: int
    gate_id: str
    role: str

    def __str__(self) -> str:
        return f"{self.pid_ns}:{self.owner_pid}:{self.owner_start}:{self.gate_id}:{self.role}"

    @classmethod
    def parse(cls, text: str) -> Mark | None:
        parts = text.split(":")
        if len(parts) != 5 or not all(p.isdigit() for p in parts[:3]):
            return None
        return cls(int(parts[0]), int(parts[1]), int(parts[2]), parts[3], parts[4])


def pid_namespace() -> int:
    """This process's pid namespace (the inode of /proc/self/ns/pid); 0 when unknown."""
    try:
        return os.stat(PROC / "self" / "ns" / "pid").st_ino
    except OSError:
        return 0


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), which
    with the pid names one process for the machine's uptime; None when it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def mark_for(gate_id: str, role: str) -> str:
    """This process's mark for an engine it launches."""
    me = os.getpid()
    return str(Mark(pid_namespace(), me, start_time(me) or 0, gate_id, role))


def _mark_of(pid: int) -> Mark | None:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's
        return None
    prefix = f"{MARK}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return Mark.parse(item[len(prefix) :].decode("utf-8", "replace"))
    return None


def marked() -> list[tuple[int, Mark]]:
    """Every live process carrying a mark, with it."""
    out = []
    me = os.getpid()
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        mark = _mark_of(int(entry.name))
        if mark is not None:
            out.append((int(entry.name), mark))
    return out


def _kill(pids: list[int]) -> list[int]:
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def kill_marked(gate_id: str, role: str | None = None) -> list[int]:
    """SIGKILL every process marked with this gate (and role): the ones that left the
    engine's process group. Returns their pids."""
    pids = [pid for pid, m in marked() if m.gate_id == gate_id and (role is None or m.role == role)]
    killed = _kill(pids)
    if killed:
        log.warning(
            "gate %s: killed %d engine processes that left their group", gate_id, len(killed)
        )
    return killed


def _owner_alive(mark: Mark) -> bool:
    return start_time(mark.owner_pid) == mark.owner_start


def sweep_orphans() -> list[int]:
    """SIGKILL every marked process whose owner (the gate process that launched its engine)
    is dead: what a SIGKILLed gate left on this host. Returns their pids."""
    ns = pid_namespace()
    orphans = [(pid, m) for pid, m in marked() if m.pid_ns == ns and not _owner_alive(m)]
    killed = _kill([pid for pid, _ in orphans])
    for pid, m in orphans:
        if pid in killed:
            log.warning(
                "killed pid %d, left by gate %s (%s engine) whose process %d is gone",
                pid,
                m.gate_id,
                m.role,
                m.owner_pid,
            )
    return killed
