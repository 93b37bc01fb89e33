"""`gate serve` (SQLite, the in-process worker) SIGKILLed with gate A running on every GPU and
gate B pending, then started again on the same data directory.

Before: the restarted service left A `running` for the whole GATE_LOST_AFTER_S (its worker
record named the dead process), and resubmitted B at once, which failed `lease_conflict`
against A's reservation: a gate that never ran reported a failure.

Now the restarted service proves its predecessor dead by its liveness mark (a lock the kernel
dropped with it: gate/service/process_marks.py) and ends A before it serves a request; B gets the
GPUs. Where the predecessor cannot be proven dead (no mark here: another host's, another data
directory), B waits for a reaper to end A instead of failing on its GPUs."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from workertools import (
    create,
    free_port,
    gate_spec,
    service_env,
    start_api,
    wait_gate,
)

from gate.core.database import make_engine, make_sessionmaker, transaction, upgrade
from gate.core.settings import Settings
from gate.models import GateRun, Reservation
from gate.service import service

pytestmark = [pytest.mark.slow, pytest.mark.timed_gate]  # real gates, wall-clock waits

Finder = Callable[..., list[int]]


def whole_node(tag: str) -> dict[str, object]:
    """A long gate on all 8 GPUs of the example inventory (4 per engine)."""
    spec = gate_spec(tag, requests=3000, rate=20.0)
    spec["shape"] = {"sku": "H200", "gpus_per_engine": 4}
    return spec


def setup(tmp_path: Path, lost_after_s: float) -> tuple[Settings, sessionmaker[Session]]:
    settings = Settings(
        data_dir=tmp_path / ".gate",
        database_url=f"sqlite:///{tmp_path / 'gate.db'}",
        heartbeat_s=1.0,
        lost_after_s=lost_after_s,
    )
    engine = make_engine(str(settings.database_url))
    upgrade(engine)
    return settings, make_sessionmaker(engine)


def reservation_holders(factory: sessionmaker[Session]) -> list[str | None]:
    with transaction(factory) as s:
        return list(s.scalars(select(Reservation.gate_id).where(Reservation.state == "active")))


def crash_with_a_running_and_b_pending(
    tmp_path: Path, settings: Settings, factory: sessionmaker[Session], tag: str
) -> tuple[str, str, dict[str, str], int]:
    """Start `gate serve`, run A until it measures, store B (pending), SIGKILL the service.
    Returns (A, B, the service's environment, its port)."""
    env = service_env(settings, GATE_LOCAL_GATES="1")
    port = free_port()
    a = create(factory, whole_node(tag))
    api = start_api(env, tmp_path / "serve-1.log", port, tmp_path)
    try:
        api.wait_ready(90)  # its start resubmits A (pending)
        wait_gate(factory, a, lambda r: (r.phase or "").startswith("scenario:"), 180)
        b = create(factory, whole_node(tag))  # pending: the one local slot is A's
        assert service.get_gate(factory, b).state == "pending"
        assert reservation_holders(factory) == [a]
    finally:
        api.proc.send_signal(signal.SIGKILL)
        api.proc.wait(30)
    return a, b, env, port


def test_a_restart_ends_its_dead_predecessors_gates_and_runs_the_pending_one(
    tmp_path: Path, tag: str
) -> None:
    # A GATE_LOST_AFTER_S no test waits out: A can only end early by the predecessor rule.
    settings, factory = setup(tmp_path, lost_after_s=600.0)
    a, b, env, port = crash_with_a_running_and_b_pending(tmp_path, settings, factory, tag)
    assert service.get_gate(factory, a).state == "running"  # the crash left it so
    api = start_api(env, tmp_path / "serve-2.log", port, tmp_path)
    try:
        api.wait_ready(90)
        # Ended before the service answered its first request, not 600 s later.
        ended = service.get_gate(factory, a)
        assert ended.state == "error", (ended.state, ended.reason)
        assert (
            "died" in (ended.reason or "")
            and (ended.document or {})["error"]["code"] == "worker_lost"
        )
        # B runs on the GPUs A held, without a lease_conflict.
        run = wait_gate(factory, b, lambda r: (r.phase or "").startswith("scenario:"), 180)
        assert run.state == "running"
        assert reservation_holders(factory) == [b]
        service.request_cancel(factory, b, "test over", admin=True)
        wait_gate(factory, b, lambda r: r.state != "running", 120)
    finally:
        api.stop()
    assert "Traceback" not in api.log()


def test_a_gate_pending_at_a_crash_waits_for_gpus_it_cannot_prove_free(
    tmp_path: Path, tag: str
) -> None:
    """Without the predecessor's mark (as if it ran on another host), A ends only when a
    reaper sees its heartbeat GATE_LOST_AFTER_S old; B waits for that, never fails on A."""
    lost_after_s = 8.0
    settings, factory = setup(tmp_path, lost_after_s=lost_after_s)
    a, b, env, port = crash_with_a_running_and_b_pending(tmp_path, settings, factory, tag)
    marks = list((settings.data_dir / "workers").glob("*.lock"))
    assert marks  # the dead service's mark, which the next start would prove dead
    for mark in marks:
        mark.unlink()
    api = start_api(env, tmp_path / "serve-2.log", port, tmp_path)
    try:
        api.wait_ready(90)
        seen: list[str] = []

        def past_waiting(r: GateRun) -> bool:
            seen.append(f"{r.state}/{r.phase}")
            assert r.state in ("pending", "running"), (r.state, r.reason)
            return (r.phase or "").startswith("scenario:")

        run = wait_gate(factory, b, past_waiting, 180)
        assert run.state == "running"
        assert "running/waiting_for_capacity" in seen  # it did wait, on A's GPUs
        ended = service.get_gate(factory, a)
        assert ended.state == "error" and "heartbeats" in (ended.reason or "")
        assert reservation_holders(factory) == [b]
        service.request_cancel(factory, b, "test over", admin=True)
        wait_gate(factory, b, lambda r: r.state != "running", 120)
    finally:
        api.stop()
    assert "Traceback" not in api.log()


def test_a_live_process_is_never_proven_dead(tmp_path: Path) -> None:
    """The proof itself, between real processes: a mark held by a live process is alive, the
    same mark after that process is SIGKILLed is dead (and removed), a name with no mark here
    proves nothing."""
    import subprocess
    import sys

    data = tmp_path / ".gate"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from gate.service.process_marks import ProcessMark; "
            "m = ProcessMark(Path(sys.argv[1]), 'api@elsewhere:1'); "
            "assert m.held; print('held', flush=True); time.sleep(120)",
            str(data),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        from gate.service.process_marks import dead_workers

        assert dead_workers(data, ["api@elsewhere:1", "api@other-host:7"]) == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    deadline = time.monotonic() + 10
    while dead_workers(data, ["api@elsewhere:1"]) != ["api@elsewhere:1"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert dead_workers(data, ["api@elsewhere:1"]) == []  # its mark is gone: proven once
