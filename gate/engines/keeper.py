"""The keeper: one small process per engine that takes every process of the engine with it.

    python -I keeper.py --grace 8 -- <engine argv...>

A process group misses what leaves it (tensor-parallel workers that call `setsid`, a launcher
that daemonises), and an environment mark (`orphans.py`) misses a child that clears its
environment. The keeper closes both: it is a *child subreaper* (Linux `PR_SET_CHILD_SUBREAPER`),
so every process the engine starts, however it detaches, is re-parented to the keeper when its
own parent dies, and stays in the keeper's tree. The keeper ends that whole tree:

- when the engine's leader exits on its own (a crash): what it left is SIGKILLed, and the keeper
  exits with the leader's status (the same code, or killed by the same signal), so the gate
  reads the crash exactly as if it had launched the engine itself;
- on SIGTERM or SIGINT (teardown): SIGTERM to every process of the tree, SIGKILL to what is
  left after `--grace` seconds;
- when the gate process dies, even by SIGKILL: the parent-death signal (`PR_SET_PDEATHSIG`)
  sends the keeper SIGTERM, and it ends the tree as above.

Standard library only, run by path with `-I`: it needs nothing from the gate's environment and
works from any working directory. Linux only; elsewhere the gate launches engines directly.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_ROUNDS = 50  # a tree that forks while being killed: rounds, 20 ms apart


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """Every live process below `root`, read from /proc (ppid is field 4 of /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap_any() -> list[tuple[int, int]]:
    """Reap every child that has exited (the re-parented ones too), without blocking."""
    out: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


def kill_tree(me: int) -> None:
    """SIGKILL every descendant until none is left (each round reaps what died)."""
    for _ in range(KILL_ROUNDS):
        _reap_any()
        left = descendants(me)
        if not left:
            return
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.02)


class Keeper:
    def __init__(self, argv: list[str], grace_s: float) -> None:
        self.argv = argv
        self.grace_s = grace_s
        self.me = os.getpid()
        self.leader = 0
        self.stop_at: float | None = None

    def _on_stop(self, signum: int, frame: object) -> None:
        if self.stop_at is None:
            self.stop_at = time.monotonic() + self.grace_s
            _signal_all(descendants(self.me), signal.SIGTERM)

    def run(self) -> int:
        """The leader's wait status (`os.waitpid`'s), once the whole tree is gone."""
        parent = os.getppid()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the gate died before the parent-death signal was set
            return 1 << 8
        try:
            self.leader = os.fork()
        except OSError as exc:
            print(f"keeper: could not fork: {exc}", file=sys.stderr)
            return 127 << 8
        if self.leader == 0:
            self._exec_engine()
        if self.stop_at is not None:  # stopped between the handler and the fork
            _signal_all([self.leader], signal.SIGTERM)
        status = self._wait_leader()
        self._let_the_rest_go()
        kill_tree(self.me)
        return status

    def _let_the_rest_go(self) -> None:
        """After a stopped leader: the rest of the tree had SIGTERM; give it the grace left."""
        while self.stop_at is not None and time.monotonic() < self.stop_at:
            _reap_any()
            if not descendants(self.me):
                return
            time.sleep(0.02)

    def _exec_engine(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if the keeper itself is SIGKILLed
        try:
            os.execvp(self.argv[0], self.argv)
        except OSError as exc:
            print(f"keeper: could not start {self.argv[0]!r}: {exc}", file=sys.stderr)
        os._exit(127)

    def _wait_leader(self) -> int:
        """The leader's wait status, reaping re-parented processes meanwhile; SIGKILLs the
        whole tree once a stop's grace has run out."""
        while True:
            for pid, status in _reap_any():
                if pid == self.leader:
                    return status
            if self.stop_at is not None and time.monotonic() >= self.stop_at:
                _signal_all(descendants(self.me), signal.SIGKILL)
            time.sleep(0.05)  # a crash is seen within 50 ms


def exit_like(status: int) -> None:
    """End this process the way the leader ended: its exit code, or its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # a signal whose default is to continue: fall through
        sys.exit(128 + sig)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(args: list[str]) -> None:
    grace_s = 8.0
    if args[:1] == ["--grace"] and len(args) > 1:
        grace_s = float(args[1])
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: keeper.py [--grace SECONDS] -- ARGV...", file=sys.stderr)
        sys.exit(2)
    exit_like(Keeper(args, grace_s).run())


if __name__ == "__main__":
    main(sys.argv[1:])
