"""No double booking at any instant: a watcher that samples, every few tenths of a second,
which GPUs the engines of a test really run on (CUDA_VISIBLE_DEVICES and the gate mark in
/proc/PID/environ) and which reservation holds each GPU (the `gpu_leases` rows), and records
every moment an engine ran on a GPU that another gate's (or another holder's) reservation
held, or two gates' engines shared one.

A sample reads the lease rows, then the engines, then the lease rows again, and counts a
lease conflict only when the same reservation held the GPU at both reads: reservation ids
only grow, so that reservation held it all along, while the engine was seen alive in
between. (An engine that died just after the first read, or a grant made just before it,
can then never be taken for a double booking.) While the database cannot be read (an
outage), the engines are still checked against each other.

GPUs are compared by index: the tests use the one-node local inventory
(examples/inventory/local.yaml)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import reading
from gate.engines import orphans
from gate.models import GpuLease, Reservation

Finder = Callable[..., list[int]]


def gpus_of(pid: int) -> set[int]:
    """The GPUs a running engine process was given, from its environment (empty when it is
    gone or was given none)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return set()
    for item in environ:
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            value = item.split(b"=", 1)[1].decode()
            return {int(g) for g in value.split(",") if g.strip().isdigit()}
    return set()


def gate_of(pid: int) -> str | None:
    """The gate an engine process belongs to, from the mark its launcher put in its env."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = f"{orphans.MARK}=".encode()
    for item in environ:
        if item.startswith(prefix):
            mark = orphans.Mark.parse(item[len(prefix) :].decode("utf-8", "replace"))
            return mark.gate_id if mark is not None else None
    return None


def engines_on_gpus(find: Finder, tag: str) -> dict[int, tuple[str | None, set[int]]]:
    """pid -> (its gate, its GPUs) for every live engine process of the tag."""
    out = {}
    for pid in find(tag):
        gpus = gpus_of(pid)
        if gpus:
            out[pid] = (gate_of(pid), gpus)
    return out


def lease_holders(factory: sessionmaker[Session]) -> dict[int, tuple[int, str | None]]:
    """GPU index -> (the reservation holding it, that reservation's gate) now."""
    with reading(factory) as s:
        rows = s.execute(
            select(GpuLease.gpu_index, GpuLease.reservation_id, Reservation.gate_id).join(
                Reservation, Reservation.id == GpuLease.reservation_id
            )
        ).all()
    return {int(g): (int(r), gid) for g, r, gid in rows}


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


@dataclass
class BookingWatch:
    """Samples until `stop` (or the end of a `with` block) on a daemon thread. A watch whose
    test failed before stopping it stops by itself once another test runs, or after `max_s`."""

    find: Finder
    tag: str
    factory: sessionmaker[Session]
    every_s: float = 0.25
    max_s: float = 900.0
    samples: int = 0  # samples taken
    lease_samples: int = 0  # of which the lease rows could be read
    engine_samples: int = 0  # of which at least one engine was running
    conflicts: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> BookingWatch:
        self._thread = threading.Thread(target=self._loop, name="booking-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> BookingWatch:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        return self

    def __enter__(self) -> BookingWatch:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _leases(self) -> dict[int, tuple[int, str | None]] | None:
        try:
            return lease_holders(self.factory)
        except Exception:  # the database is down or restarting: engines only, this time
            return None

    def _loop(self) -> None:
        test, until = _current_test(), time.monotonic() + self.max_s
        while not self._stop.is_set() and _current_test() == test and time.monotonic() < until:
            self.sample()
            self._stop.wait(self.every_s)

    def sample(self) -> None:
        before = self._leases()
        engines = engines_on_gpus(self.find, self.tag)
        after = self._leases() if before is not None else None
        self.samples += 1
        self.engine_samples += bool(engines)
        if before is not None and after is not None:
            self.lease_samples += 1
            for pid, (gate, gpus) in engines.items():
                for g in gpus:
                    first, second = before.get(g), after.get(g)
                    if first is None or first != second or first[1] == gate:
                        continue
                    self.conflicts.append(
                        f"engine {pid} of gate {gate} on GPU {g}, held by reservation "
                        f"{first[0]} (gate {first[1]}) at {time.strftime('%H:%M:%S')}"
                    )
        seen: dict[int, tuple[int, str | None]] = {}
        for pid, (gate, gpus) in engines.items():
            for g in gpus:
                other = seen.get(g)
                if other is not None and other[1] != gate:
                    self.conflicts.append(
                        f"engines {other[0]} (gate {other[1]}) and {pid} (gate {gate}) both on "
                        f"GPU {g} at {time.strftime('%H:%M:%S')}"
                    )
                seen[g] = (pid, gate)

    def summary(self) -> str:
        """For the fault table's GPUs column."""
        return (
            f"double booked in {len(self.conflicts)} of {self.samples} samples "
            f"({self.engine_samples} with engines up, {self.lease_samples} with the lease rows)"
        )
