"""The fault suite for the embedded database: a real `gate run` process on SQLite, and another
process holding SQLite's write lock for longer than the gate's lease TTL (what a long
transaction of another writer on the same file does).

The gate cannot renew its lease while it waits for the lock: it must stop its engines before
the lease could expire, end in hold with `lease_lost` once it can write again, and leave the
GPUs to the next reservation with no engine of its own still on them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from booking import BookingWatch, gpus_of
from faults import fault_row, gpus_cell
from gaterun import SIM, start_gate_run, the_gate, wait_for, whole_node_grant

from gate.core.database import make_engine, make_sessionmaker
from gate.core.vocabulary import EXIT_ERROR
from gate.models import GateRun
from gate.reservations import leases

pytestmark = pytest.mark.slow

TTL_S = 8.0
LOCK_S = 14.0  # longer than the TTL: no renewal can get through
Finder = Callable[..., list[int]]

LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
print("released", flush=True)
"""


def _document(stdout: str) -> dict[str, Any]:
    """The verdict document `gate run --json` prints after its summary."""
    at = 0 if stdout.startswith("{") else stdout.index("\n{\n") + 1
    doc: dict[str, Any] = json.loads(stdout[at:])
    return doc


def test_a_write_lock_held_longer_than_the_lease_stops_the_gate_before_its_gpus_go(
    tmp_path: Path, tag: str, find_processes: Finder
) -> None:
    db = tmp_path / "gate.db"
    out = tmp_path / "gate-run.out"
    engine = {"command": [*SIM, "--tag", tag, "--profile", "tiny"]}
    with out.open("wb") as stdout, (tmp_path / "gate-run.err").open("wb") as stderr:
        gate = start_gate_run(
            tmp_path,
            engine,
            name="sqlite-lock",
            env={"GATE_LEASE_TTL_S": str(TTL_S), "GATE_HEARTBEAT_S": "0.5"},
            args=("--json",),
            stdout=stdout,
            stderr=stderr,
        )
    locker: subprocess.Popen[bytes] | None = None
    try:
        wait_for(db.exists, 60, "the gate's database")
        factory = make_sessionmaker(make_engine(f"sqlite:///{db}"))

        def in_scenario() -> GateRun | None:
            run = the_gate(factory)
            if run is None or not (run.phase or "").startswith("scenario:"):
                return None
            return run if len(find_processes(tag)) == 2 else None

        first: GateRun = wait_for(in_scenario, 120, "the scenario to start")
        assert first.state == "running"
        engines = find_processes(tag)
        held = leases.active_leases(factory)
        assert held, "the gate holds no lease"
        on_engines = set().union(*(gpus_of(p) for p in engines))
        # What the engines were given is what the lease rows hold.
        assert on_engines == {lease.gpu_index for lease in held}

        watch = BookingWatch(find_processes, tag, factory).start()
        lock_log = tmp_path / "locker.out"
        locked_from = time.monotonic()  # before the lock is taken: the bound is conservative
        with lock_log.open("wb") as lock_out:
            locker = subprocess.Popen(
                [sys.executable, "-c", LOCKER, str(db), str(LOCK_S)], stdout=lock_out
            )
        wait_for(lambda: "locked" in lock_log.read_text(), 60, "the write lock")
        wait_for(lambda: find_processes(tag, keepers=True) == [], 30, "the engines to stop")
        stopped_after = time.monotonic() - locked_from
        assert stopped_after < TTL_S, f"engines ran {stopped_after:.1f} s into the lock"
        assert gate.poll() is None, "the gate must wait for the database to say how it ended"
        assert locker.wait(timeout=LOCK_S + 60) == 0
        assert "released" in lock_log.read_text()

        # The GPUs' next holder asks for the whole node (8 GPUs: it fits only on the first
        # gate's GPUs too) as soon as the lock is gone.
        second: leases.Grant = wait_for(lambda: whole_node_grant(factory), 60, "the next grant")
        granted = {g for e in second.placement.engines for g in e.gpus}
        assert on_engines <= granted, "the next grant got the first gate's GPUs (the fault)"
        assert find_processes(tag, keepers=True) == [], "two gates' engines on the same GPUs"

        assert gate.wait(timeout=120) == EXIT_ERROR
        doc = _document(out.read_text())
        assert (doc["state"], doc["verdict"], doc["exit_code"]) == ("error", "hold", EXIT_ERROR)
        assert doc["error"]["code"] == "lease_lost", doc["error"]
        reason = doc["reasons"][0]["message"]
        assert "lease of reservation" in reason, reason
        assert doc["reservation"]["state"] == "lost"
        stored = the_gate(factory)
        assert stored is not None and (stored.state, stored.verdict) == ("error", "hold")
        leases.release(factory, second.reservation_id, "test over")
        left = len(leases.active_leases(factory))
        watch.stop()
        assert watch.conflicts == [], watch.conflicts
        assert left == 0
        orphans = find_processes(tag, keepers=True)
        assert orphans == []
        fault_row(
            fault=f"SQLite write lock held {LOCK_S:g} s by another process (lease TTL {TTL_S:g} s)",
            operator_sees=f"`gate run` exits {gate.returncode}: {doc['error']['code']}: {reason}",
            final_state=f"{doc['state']}, {doc['verdict']} ({doc['error']['code']}); engines "
            f"stopped {stopped_after:.1f} s into the lock; reservation "
            f"{doc['reservation']['state']}",
            gpus=gpus_cell(
                left,
                f"next grant overlapped {len(on_engines & granted)} GPU(s) of the first "
                f"gate, none of its engines left; {watch.summary()}",
            ),
            orphans=len(orphans),
            lost=0 if stored.state in ("error", "complete", "cancelled") else 1,
        )
    finally:
        for proc in (gate, locker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
