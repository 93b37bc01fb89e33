"""The fault suite for the gate process itself: `kill -9` of a real `gate run` mid-scenario,
whose engines each started a grandchild that left the process group and cleared its
environment (as tensor-parallel workers can), so no mark names it.

Nothing of the gate may survive it (the keepers' parent-death signal ends every engine tree),
and the gate must not stay "running" with its GPUs booked: a reaper on the same database (what
`gate serve` and every `gate worker` run) ends it in hold once its heartbeat is
GATE_LOST_AFTER_S old and releases its reservation, and the GPUs can be granted again."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from booking import BookingWatch, gpus_of
from faults import fault_row, gpus_cell
from gaterun import hidden_engine, start_gate_run, the_gate, wait_for, whole_node_grant
from sqlalchemy import select

from gate.core.database import make_engine, make_sessionmaker, transaction
from gate.core.settings import Settings
from gate.core.vocabulary import FINISHED
from gate.models import GateRun, Reservation
from gate.reservations import leases
from gate.service.reaper import Reaper

pytestmark = pytest.mark.slow

LOST_AFTER_S = 3.0
Finder = Callable[..., list[int]]


def test_a_sigkilled_gate_run_leaves_no_process_and_its_gate_is_ended_by_a_reaper(
    tmp_path: Path, tag: str, find_processes: Finder
) -> None:
    db = tmp_path / "gate.db"
    gate = start_gate_run(
        tmp_path, hidden_engine(tag), name="sigkill", env={"GATE_HEARTBEAT_S": "0.5"}
    )
    try:
        wait_for(db.exists, 60, "the gate's database")
        factory = make_sessionmaker(make_engine(f"sqlite:///{db}"))

        def in_scenario() -> GateRun | None:
            run = the_gate(factory)
            if run is None or not (run.phase or "").startswith("scenario:"):
                return None
            return run if len(find_processes(tag)) >= 4 else None  # 2 engines, 2 hidden

        first: GateRun = wait_for(in_scenario, 120, "the scenario and the grandchildren")
        rows = leases.active_leases(factory)
        on_engines = set().union(*(gpus_of(p) for p in find_processes(tag)))
        assert on_engines and on_engines == {lease.gpu_index for lease in rows}
        watch = BookingWatch(find_processes, tag, factory).start()

        gate.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert gate.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: find_processes(tag, keepers=True) == [], 15, "every engine process")
        gone_s = time.monotonic() - killed_at
        stale = the_gate(factory)
        assert stale is not None and stale.state == "running"  # nobody could write its end

        # A reaper on this database, as `gate serve` or a worker runs one.
        settings = Settings(
            database_url=f"sqlite:///{db}",
            data_dir=tmp_path / ".gate",
            heartbeat_s=0.5,
            lost_after_s=LOST_AFTER_S,
        )
        reaper = Reaper(settings, factory)
        ended = wait_for(reaper.once, LOST_AFTER_S + 30, "the reaper to end the gate")
        ended_s = time.monotonic() - killed_at
        assert ended == [first.id]
        run = the_gate(factory)
        assert run is not None and (run.state, run.verdict) == ("error", "hold")
        assert run.reason is not None and "stopped sending heartbeats" in run.reason
        assert run.document is not None
        check = run.document["reasons"][0]["check"]
        assert check == "gate.worker_lost"
        with transaction(factory) as s:
            ends = [(r.state, r.release_reason) for r in s.scalars(select(Reservation))]
        assert ends == [("released", "worker lost")]
        held = len(leases.active_leases(factory))
        assert held == 0
        # The GPUs can be granted again, and nothing of the first gate runs on them.
        grant = whole_node_grant(factory)
        granted = {g for e in grant.placement.engines for g in e.gpus}
        assert on_engines <= granted
        assert find_processes(tag, keepers=True) == []
        leases.release(factory, grant.reservation_id, "test over")
        watch.stop()
        assert watch.conflicts == [], watch.conflicts
        left = find_processes(tag, keepers=True)
        fault_row(
            fault="`gate run` SIGKILLed mid-scenario, each engine with a grandchild that left "
            "its group and cleared its environment",
            operator_sees=f"`gate run` killed ({gate.returncode}), no verdict printed; the "
            f"gate row says running until a reaper ends it: {run.reason}",
            final_state=f"{run.state}, {run.verdict} ({check}) {ended_s:.1f} s after the kill "
            f"(GATE_LOST_AFTER_S {LOST_AFTER_S:g}); every engine process gone "
            f"{gone_s:.1f} s after it",
            gpus=gpus_cell(
                held,
                f"reservation {ends[0][0]} ({ends[0][1]}), granted again; {watch.summary()}",
            ),
            orphans=len(left),
            lost=int(run.state not in FINISHED),
        )
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait()
