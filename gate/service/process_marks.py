"""A process's mark, so that its successor can prove it dead.

A running gate's row names its worker process (`api@host:pid`, `worker@host:pid`). When that
process is SIGKILLed, the row stays `running` until a reaper sees its heartbeat GATE_LOST_AFTER_S
old (30 s by default), and its GPUs stay reserved that long: a gate pending at the crash,
resubmitted at the restart, failed at once with `lease_conflict` against them. A process that
runs gates therefore holds an exclusive lock (flock) on a file named after it in
`GATE_DATA_DIR/workers/`, for as long as it lives. The kernel drops the lock when the process
dies, however it dies, so a successor sharing the data directory (a restarted `gate serve` or
`gate worker`, same host or same volume) proves a predecessor dead by taking its lock, and
ends its gates at once. A name with no lock file here (another host, another data directory)
proves nothing: the reapers' heartbeat rule covers it. Not a pid check: a container's restarted
process often has its predecessor's pid (1), and another pid namespace can show a live
process's pid as free.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("gate.runs")

LOCK_DIR = "workers"


def _lock_path(data_dir: Path, worker: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", worker)[:120]
    digest = hashlib.sha256(worker.encode()).hexdigest()[:12]  # two names never share a file
    return data_dir / LOCK_DIR / f"{safe}.{digest}.lock"


class ProcessMark:
    """This process's lock (see above), held until `release` or the process's death. `held`
    is False when it could not be taken (then this process's death is left to the reapers)."""

    WAIT_S = 5.0  # a successor testing a predecessor of our very name holds it an instant

    def __init__(self, data_dir: Path, worker: str) -> None:
        self.worker = worker
        self.path = _lock_path(data_dir, worker)
        self._fd: int | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = self._take()
        except OSError as exc:
            log.warning("%s: no liveness mark in %s (%s)", worker, self.path.parent, exc)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _take(self) -> int | None:
        deadline = time.monotonic() + self.WAIT_S
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() > deadline:
                    log.warning("%s: its liveness mark is held by another process", self.worker)
                    return None
                time.sleep(0.05)
                continue
            except OSError:
                os.close(fd)
                raise
            try:
                if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                    os.close(fd)  # a successor removed that file as we opened it: again
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, self.worker.encode())
            return fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(fd)


def dead_workers(data_dir: Path, workers: Iterable[str]) -> list[str]:
    """The workers among `workers` proven dead: their lock file is here and nobody holds its
    lock. Each proven dead has its file removed (it never comes back under that name but as a
    new process, which makes its own)."""
    dead = []
    for worker in workers:
        path = _lock_path(data_dir, worker)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue  # no mark here: not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: alive
        try:
            if os.read(fd, 4096).decode(errors="replace") == worker:
                dead.append(worker)
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)  # closing drops the lock
    return dead
