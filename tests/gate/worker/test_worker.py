"""`gate worker` for real: Celery on a real Redis, gates in a real PostgreSQL, sim engines as
real processes. A gate runs to a verdict; a duplicate delivery runs it once; a worker killed
with SIGKILL mid-gate loses nothing (the gate ends in hold naming the lost worker, its GPUs
are released, its engines die with the worker, the redelivered message is skipped); an API
(`gate serve`) killed with SIGKILL mid-gate loses nothing either (the worker runs the gate to
its verdict and sends its commit status once; a restarted API serves it); cancel and SIGTERM
end a running gate cancelled with everything torn down."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from booking import BookingWatch
from faults import fault_row, gpus_cell
from receiver import Receiver
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from workertools import (
    active_leases,
    create,
    finished,
    free_port,
    gate_spec,
    measuring,
    service_env,
    start_api,
    submit,
    wait_gate,
)

from gate.access.tokens import create_token
from gate.core.database import transaction
from gate.core.settings import Settings
from gate.core.vocabulary import FINISHED
from gate.engines.keeper import descendants
from gate.integrations.signatures import sign
from gate.models import GatePhase, GateRun, Reservation
from gate.service import service
from gate.service.reaper import Reaper
from gate.worker.celery_dispatch import CeleryDispatcher
from gate.worker.main import alive_file

pytestmark = pytest.mark.slow

API_READY_S = 60.0  # a Python process importing FastAPI, Celery and the gate on busy cores
CONTINUES = {"requests": 168, "rate": 20.0}  # 5 time blocks of 2 s: latency compared
StartWorker = Callable[..., Any]  # conftest.start_worker: starts a `gate worker` process
Finder = Callable[..., list[int]]  # conftest.processes_with(tag, keepers=False)


def phases(factory: sessionmaker[Session], gate_id: str, phase: str) -> int:
    with transaction(factory) as s:
        return int(
            s.scalar(
                select(func.count())
                .select_from(GatePhase)
                .where(GatePhase.gate_id == gate_id, GatePhase.phase == phase)
            )
            or 0
        )


def broker_empty(redis_url: str) -> tuple[int, int]:
    """(messages waiting in the gates queue, messages delivered but not acknowledged)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.llen("gates")), int(client.hlen("unacked"))
    finally:
        client.close()


def wait_acknowledged(redis_url: str, timeout: float = 10.0) -> tuple[int, int]:
    """`broker_empty` once the worker has acknowledged: the ack follows the task's return,
    which follows the worker's "finished" log line, so the moment after that line may still
    see the message unacknowledged (it did, once, in CI). Returns the last reading."""
    deadline = time.monotonic() + timeout
    seen = broker_empty(redis_url)
    while seen != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = broker_empty(redis_url)
    return seen


def wait_engines_gone(find: Finder, tag: str, timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while find(tag):
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"engines {find(tag)} still alive after {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - t0


def _polled(run: GateRun, settings: Settings) -> str:
    """What a rollout controller polling GET /v1/gates/{id}/verdict reads for this gate."""
    summary = service.verdict_summary(run, settings.public_url).model_dump(mode="json")
    return "GET verdict: " + ", ".join(
        f"{k} {summary[k]}" for k in ("state", "verdict", "reason") if summary[k]
    )


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def test_worker_runs_a_gate_to_a_verdict(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    tag: str,
) -> None:
    worker = start_worker()
    gate_id = create(factory, gate_spec(tag, requests=60))
    submit(settings, gate_id)
    run = wait_gate(factory, gate_id, finished, timeout=90)
    assert run.state == "complete", run.reason
    assert run.verdict in ("continue", "hold")
    assert run.worker == worker.name and run.attempts == 1
    assert run.document is not None and run.document["checks"]
    assert any(c["id"] == "steady.ttft.p50" for c in run.document["checks"])
    assert active_leases(factory) == 0
    worker.wait_for(f"gate {gate_id} finished: complete", 10)
    log = worker.log()
    # Structured progress lines carry the gate id, one per phase.
    for phase in ("reserved", "model_listed", "scenario:steady", "judging", "released"):
        assert f"gate_id={gate_id} " in log and f"phase={phase} " in log, phase
    assert f"gate_id={gate_id} scenario=steady" in log
    assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
    # The health file the container check reads: touched by the reaper every heartbeat.
    alive = alive_file(settings)
    assert time.time() - alive.stat().st_mtime < 5 * settings.heartbeat_s
    assert worker.stop() == 0


def test_the_api_queues_gates_that_workers_run(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    tag: str,
) -> None:
    """The whole scale-out path: POST /v1/gates on an API configured with PostgreSQL and
    Redis queues a Celery task; /metrics shows it waiting; a `gate worker` started later runs
    it; the API serves the verdict it stored."""
    from apitools import SIM_TEMPLATE, sim_engine
    from fastapi.testclient import TestClient

    from gate.access.tokens import create_token
    from gate.api.app import create_app

    api_settings = settings.model_copy(update={"engines": {"sim": SIM_TEMPLATE}})
    body = {
        **gate_spec(tag, requests=60),
        "reference": sim_engine(tag, "--seed", "1"),  # a caller's engines: the operator's
        "candidate": sim_engine(tag, "--seed", "2"),  # template with its parameters
    }
    with TestClient(create_app(api_settings)) as api:
        token = create_token(factory, "ci", ["run"])
        headers = {"Authorization": f"Bearer {token}"}
        created = api.post("/v1/gates", json={"spec": body}, headers=headers)
        assert created.status_code == 202, created.text
        gid = created.json()["id"]
        assert broker_empty(str(settings.broker_url)) == (1, 0)  # queued, no worker yet
        assert "gate_queue_depth 1.0" in api.get("/metrics", headers=headers).text
        assert api.get(f"/v1/gates/{gid}/verdict", headers=headers).json()["state"] == "pending"

        worker = start_worker()
        deadline = time.monotonic() + 120
        while True:
            summary = api.get(f"/v1/gates/{gid}/verdict", headers=headers).json()
            if summary["state"] in ("complete", "error") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert summary["state"] == "complete" and summary["verdict"] in ("continue", "hold")
        assert summary["report_url"].endswith(f"/gates/{gid}")
        view = api.get(f"/v1/gates/{gid}", headers=headers).json()
        assert view["worker"] == worker.name and view["attempts"] == 1
        doc = api.get(f"/v1/gates/{gid}/document", headers=headers).json()
        assert any(c["id"] == "steady.ttft.p50" for c in doc["checks"])
        metrics = api.get("/metrics", headers=headers).text
        assert "gate_queue_depth 0.0" in metrics
        assert 'gate_gates{state="complete",verdict="' in metrics
        # the seconds spent in each phase: released is the gate's last, nothing follows it
        # (two scenarios: the spec's and the default correctness stage the gate adds; the
        # capability asks after the warm-up are a phase of their own)
        phases = {"requested": 1, "reserved": 1, "capabilities": 1, "scenario": 2, "judging": 1}
        for phase, count in phases.items():
            assert f'gate_phase_seconds_count{{phase="{phase}"}} {count:.1f}' in metrics, phase
        assert 'gate_phase_seconds_count{phase="released"}' not in metrics
        assert 'gate_engine_phase_seconds_count{phase="ready",role="candidate"} 1.0' in metrics
    assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
    assert worker.stop() == 0


def test_a_task_delivered_twice_runs_the_gate_once(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    tag: str,
) -> None:
    # Two gates at a time (threads pool): both deliveries run at once and race for the claim.
    worker = start_worker("--concurrency", "2")
    gate_id = create(factory, gate_spec(tag, requests=40))
    submit(settings, gate_id, times=2)
    run = wait_gate(factory, gate_id, finished, timeout=90)
    assert run.state == "complete", run.reason
    assert run.attempts == 1
    worker.wait_for(f"gate {gate_id} finished", 10)
    worker.wait_for(f"gate {gate_id} not pending", 10)
    log = worker.log()
    # Every delivery but one was skipped. (A gate that outlives the tests' 4 s visibility
    # timeout gets one more delivery per timeout, and that one is skipped too.)
    deliveries = log.count(f"Task gate.run[gate-{gate_id}] received")
    assert log.count(f"gate {gate_id} claimed by") == 1
    assert log.count(f"gate {gate_id} not pending") == deliveries - 1 >= 1
    assert phases(factory, gate_id, "launched") == 2  # one reference, one candidate
    assert phases(factory, gate_id, "requested") == 1
    assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
    assert worker.stop() == 0


@pytest.mark.parametrize("lost_after_s", [3.0])
def test_sigkill_of_a_worker_mid_gate_loses_nothing(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    find_processes: Finder,
    tag: str,
    receiver: Receiver,
) -> None:
    first = start_worker()
    status_url = f"{receiver.url}/repos/acme/llm/statuses/abc123"
    gate_id = create(factory, gate_spec(tag, requests=3000, rate=20), {"url": status_url})
    submit(settings, gate_id)
    t_submit = time.monotonic()
    watch = BookingWatch(find_processes, tag, factory).start()
    wait_gate(factory, gate_id, measuring, timeout=90)
    engines = find_processes(tag)
    assert len(engines) == 2
    # The worker's: each engine runs under a keeper (gate/engines/keeper.py) the worker started.
    keepers = {parent_of(p) for p in engines}
    assert len(keepers) == 2 and {parent_of(k) for k in keepers} == {first.pid}
    assert all("keeper.py" in Path(f"/proc/{k}/cmdline").read_text() for k in keepers)

    os.kill(first.pid, signal.SIGKILL)  # what a node loss or the OOM killer does
    first.proc.wait()
    t_kill = time.monotonic()
    engines_gone_s = wait_engines_gone(find_processes, tag)  # parent-death signal

    # A second real worker on the same data directory: it proves the first dead by its
    # liveness mark (gate/service/process_marks.py) and ends the gate at its start, without waiting
    # for the heartbeat to age; Redis redelivers the unacknowledged message to it after the
    # visibility timeout.
    second = start_worker(wait_ready=False)
    run = wait_gate(factory, gate_id, finished, timeout=settings.lost_after_s + 30)
    ended_s = time.monotonic() - t_kill
    second.wait_for(f"{second.name} ready", 60)
    ready_s = time.monotonic() - t_kill
    assert run.state == "error" and run.verdict == "hold"
    assert run.reason is not None
    assert f"the worker running this gate ({first.name}) died" in run.reason
    assert run.document is not None and run.document["reasons"][0]["check"] == "gate.worker_lost"
    check = run.document["reasons"][0]["check"]
    # Ended as the second worker starts (a Python process importing Celery and the gate on
    # two shared cores: seconds), never later than the heartbeat rule would have.
    assert ended_s <= settings.lost_after_s + 15, ended_s
    assert active_leases(factory) == 0
    with transaction(factory) as s:
        reservations = list(s.scalars(select(Reservation).where(Reservation.gate_id == gate_id)))
    assert [(r.state, r.release_reason) for r in reservations] == [("released", "worker lost")]
    # The commit status the dead worker owed: sent by a reaper, naming the lost worker.
    deadline = time.monotonic() + 30
    while not receiver.calls and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(receiver.calls) == 1, receiver.calls
    status = receiver.calls[0][1]
    assert status["state"] == "failure" and "died" in status["description"]
    assert status["target_url"] == f"http://gate.test/gates/{gate_id}"

    # The redelivered message does not start the gate again. (It may come before the reaper
    # ended the gate, "not pending (running", or after, "not pending (error": skipped both ways.)
    vt = settings.broker_visibility_timeout_s
    second.wait_for(f"gate {gate_id} not pending (", vt + 20)
    skipped_s = time.monotonic() - t_kill
    assert find_processes(tag) == []
    run = service.get_gate(factory, gate_id)
    assert (run.state, run.attempts) == ("error", 1)
    assert phases(factory, gate_id, "requested") == 1
    assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
    assert second.stop() == 0
    held = active_leases(factory)
    watch.stop()
    assert watch.conflicts == [], watch.conflicts
    left = find_processes(tag, keepers=True)
    assert left == []
    fault_row(
        fault="worker SIGKILLed mid-gate, a second worker started on its data directory "
        "(it proves the first dead by its liveness mark)",
        operator_sees=f"commit status {status['state']} (sent by a reaper): "
        f"{status['description']}",
        final_state=f"{run.state}, {run.verdict} ({check}) "
        f"{ended_s:.1f} s after the kill; engines gone {engines_gone_s:.1f} s after it; the "
        f"redelivered task skipped (attempts {run.attempts})",
        gpus=gpus_cell(held, f"reservation {reservations[0].release_reason!r}; {watch.summary()}"),
        orphans=len(left),
        lost=abs(1 - len(receiver.calls)) + (run.state not in FINISHED),
    )
    print(
        f"\nSIGKILL, seconds after the kill: engines gone {engines_gone_s:.2f}; gate ended "
        f"in hold {ended_s:.2f} (lost_after_s={settings.lost_after_s}, heartbeat_s="
        f"{settings.heartbeat_s}); second worker ready {ready_s:.2f}; redelivered message "
        f"skipped by {skipped_s:.2f} (visibility timeout {vt}s from delivery, "
        f"{t_kill - t_submit:.2f}s before the kill)"
    )


def _ci_delivery(tag: str, callback_url: str) -> bytes:
    """A CI webhook delivery for a 15 s gate (300 requests at 20/s) with a commit status: long
    enough to kill the API while it measures and check the engines run on."""
    from apitools import spec_dict

    body = {
        "delivery_id": f"d-{tag[:12]}",
        "timestamp": time.time(),
        "spec": spec_dict(tag, requests=300, rate=20),
        "callback": {"url": callback_url},
    }
    return json.dumps(body).encode()


def test_sigkill_of_the_api_mid_gate_loses_nothing(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    find_processes: Finder,
    tag: str,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    """The scale-out mode for real: `gate serve` (PostgreSQL, Redis) takes a signed CI
    webhook, a `gate worker` runs the gate, and the API is SIGKILLed mid-gate. The gate runs
    to its verdict on the worker, which sends the commit status once; the GPUs are released;
    nothing is left running; a restarted API serves the verdict and sends nothing again."""
    from apitools import SECRET, SIM_TEMPLATE

    from gate.integrations.callbacks import status_body

    worker = start_worker()
    env = service_env(
        settings, GATE_WEBHOOK_SECRET=SECRET, GATE_ENGINES=json.dumps({"sim": SIM_TEMPLATE})
    )
    port, log = free_port(), tmp_path / "api.log"
    api = start_api(env, log, port, tmp_path)
    try:
        api.wait_ready(API_READY_S)
        status_url = f"{receiver.url}/repos/acme/llm/statuses/abc123"
        raw = _ci_delivery(tag, status_url)
        created = httpx.post(
            f"{api.url}/v1/webhooks/ci",
            content=raw,
            headers={"Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET, raw)},
            timeout=30,
        )
        assert created.status_code == 202, created.text
        gate_id = created.json()["gate"]["id"]
        watch = BookingWatch(find_processes, tag, factory).start()
        wait_gate(factory, gate_id, measuring, timeout=90)
        engines = find_processes(tag)
        assert len(engines) == 2
        assert set(engines) <= set(descendants(worker.pid))  # the worker's, not the API's

        api.proc.send_signal(signal.SIGKILL)  # an OOM kill, a node's API pod evicted
        assert api.proc.wait(timeout=30) == -signal.SIGKILL
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{api.url}/v1/gates/{gate_id}/verdict", timeout=5)
        assert find_processes(tag) == engines  # the gate runs on, on the worker

        run = wait_gate(factory, gate_id, finished, timeout=180)
        assert run.state == "complete", run.reason
        assert run.verdict in ("continue", "hold")
        assert (run.worker, run.attempts) == (worker.name, 1)
        worker.wait_for(f"gate {gate_id} finished: complete", 30)
        calls = receiver.settled(1)
        assert len(calls) == 1, calls  # the worker sent it; nobody sent it again
        expected = status_body(service.verdict_summary(run, settings.public_url), "llm-deploy-gate")
        assert calls[0][1] == expected
        assert receiver.paths == ["/repos/acme/llm/statuses/abc123"]
        wait_engines_gone(find_processes, tag, timeout=15)
        held = active_leases(factory)
        watch.stop()
        assert held == 0
        assert watch.conflicts == [], watch.conflicts

        # The API comes back (on the same port) and serves the verdict the worker stored.
        api = start_api(env, log, port, tmp_path)
        api.wait_ready(API_READY_S)
        token = create_token(factory, "ci-read", ["read"])
        served = httpx.get(
            f"{api.url}/v1/gates/{gate_id}/verdict",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert served.status_code == 200, served.text
        summary = served.json()
        assert (summary["state"], summary["verdict"], summary["reason"]) == (
            "complete",
            run.verdict,
            run.reason,
        )
        # Its reaper passes (every heartbeat) owe this gate nothing: still one status.
        time.sleep(6 * settings.heartbeat_s)
        assert len(receiver.calls) == 1, receiver.calls
        # A clean stop: uvicorn finishes its shutdown, then re-raises the SIGTERM it caught.
        assert api.stop() in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in api.log()
        assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
        assert worker.stop() == 0
        left = find_processes(tag, keepers=True)
        assert left == []
        fault_row(
            fault="API (`gate serve`) SIGKILLed mid-gate, scale-out mode (PostgreSQL, Redis, "
            "one worker)",
            operator_sees="connection refused until the API is back; then GET verdict: "
            + ", ".join(str(summary[k]) for k in ("state", "verdict", "reason") if summary[k]),
            final_state=f"{run.state}, {run.verdict} on {run.worker} (attempts {run.attempts}); "
            f"commit status {calls[0][1]['state']} sent {len(receiver.calls)}x",
            gpus=gpus_cell(held, watch.summary()),
            orphans=len(left),
            lost=abs(1 - len(receiver.calls)) + (run.state not in ("complete", "error")),
        )
    finally:
        if api.proc.poll() is None:
            api.proc.kill()
            api.proc.wait()


@pytest.mark.parametrize("requeue_after_s", [1.0])
def test_a_gate_whose_task_was_lost_is_queued_again_and_runs(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    find_processes: Finder,
    tag: str,
) -> None:
    """The API stored a gate and died before queueing it (or the broker lost the message):
    a reaper sees it pending with no task in the broker, queues it, and a worker runs it. A
    gate whose task is waiting in the queue is left alone."""
    # 168 requests at 20/s: 5 time blocks, the least load that compares latency, so that
    # identical engines can continue (fewer than 4 blocks cannot compare it, which holds)
    lost = create(factory, gate_spec(tag, **CONTINUES))
    queued = create(factory, {**gate_spec(tag, **CONTINUES), "name": "queued"})
    dispatcher = CeleryDispatcher(settings)
    try:
        dispatcher.submit(queued)
        time.sleep(settings.requeue_after_s + 0.5)
        assert dispatcher.queued_ids() == {queued}
        # A reaper pass in this process (the same one the API and workers run)
        assert Reaper(settings, factory, requeue=dispatcher).requeue_stuck() == [lost]
        assert dispatcher.queued_ids() == {queued, lost}
        assert Reaper(settings, factory, requeue=dispatcher).requeue_stuck() == []
    finally:
        dispatcher.close()
    # A third one, never queued: this time the worker's own reaper finds it.
    third = create(factory, {**gate_spec(tag, **CONTINUES), "name": "third"})
    worker = start_worker()
    runs = []
    for gid in (lost, queued, third):
        run = wait_gate(factory, gid, finished, timeout=240)
        assert (run.state, run.verdict) == ("complete", "continue"), run.reason
        assert run.attempts == 1
        runs.append(run)
    requeued = f"gate {third} was pending with no task in the broker: queued again"
    assert requeued in worker.log()
    assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
    assert worker.stop() == 0
    held = active_leases(factory)
    left = find_processes(tag, keepers=True)
    fault_row(
        fault="a stored gate's task lost (the API died before queueing it, or the broker "
        "dropped it); GATE_REQUEUE_AFTER_S 1 s",
        operator_sees=f"worker log: {requeued.replace(third, '<id>')}",
        final_state="; ".join(
            f"{r.name}: {r.state}, {r.verdict} (attempts {r.attempts})" for r in runs
        ),
        gpus=gpus_cell(held),
        orphans=len(left),
        lost=sum(r.state not in FINISHED for r in runs),
    )


def test_cancel_of_a_running_gate_tears_it_down(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    find_processes: Finder,
    tag: str,
) -> None:
    worker = start_worker()
    gate_id = create(factory, gate_spec(tag, requests=3000, rate=20))
    submit(settings, gate_id)
    wait_gate(factory, gate_id, measuring, timeout=90)
    assert len(find_processes(tag)) == 2
    t0 = time.monotonic()
    service.request_cancel(factory, gate_id, admin=True)
    run = wait_gate(factory, gate_id, finished, timeout=30)
    assert (run.state, run.verdict, run.reason) == (
        "cancelled",
        "hold",
        "cancelled on request before the gate could decide",
    )
    cancelled_s = time.monotonic() - t0
    assert cancelled_s < 15
    wait_engines_gone(find_processes, tag, timeout=5)
    assert active_leases(factory) == 0
    worker.wait_for(f"gate {gate_id} finished: cancelled", 10)
    assert worker.proc.poll() is None  # the worker lives on, ready for the next gate
    assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
    assert worker.stop() == 0
    left = find_processes(tag, keepers=True)
    fault_row(
        fault="cancel of a running gate (admin request)",
        operator_sees=_polled(run, settings),
        final_state=f"{run.state}, {run.verdict} {cancelled_s:.1f} s after the request; the "
        "worker lives on",
        gpus=gpus_cell(active_leases(factory)),
        orphans=len(left),
        lost=int(run.state not in FINISHED),
    )


@pytest.mark.parametrize("gates", [1, 2], ids=["solo-pool", "threads-pool"])
def test_sigterm_stops_the_running_gates_and_releases_everything(
    settings: Settings,
    factory: sessionmaker[Session],
    start_worker: StartWorker,
    find_processes: Finder,
    tag: str,
    gates: int,
) -> None:
    worker = start_worker("--concurrency", str(gates))
    gate_ids = [create(factory, gate_spec(tag, requests=3000, rate=20)) for _ in range(gates)]
    for gate_id in gate_ids:
        submit(settings, gate_id)
    watch = BookingWatch(find_processes, tag, factory).start()
    for gate_id in gate_ids:
        wait_gate(factory, gate_id, measuring, timeout=90)
    assert len(find_processes(tag)) == 2 * gates
    t0 = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)  # warm shutdown: docker stop, a pod deletion
    assert worker.proc.wait(timeout=30) == 0
    exited_s = time.monotonic() - t0
    watch.stop()
    assert watch.conflicts == [], watch.conflicts
    for gate_id in gate_ids:
        run = service.get_gate(factory, gate_id)
        assert (run.state, run.verdict, run.reason) == (
            "cancelled",
            "hold",
            f"the worker running this gate ({worker.name}) was shut down (SIGTERM) before the "
            "gate could decide; its engines were torn down and its GPUs released",
        )
    assert find_processes(tag) == []
    assert active_leases(factory) == 0
    assert exited_s < 15, exited_s
    # Every message was acknowledged. The threads pool keeps sweeping for expired messages
    # while gates run, so a gate older than the tests' 4 s visibility timeout may also have
    # left a redelivered copy in the queue: the next worker skips it and nothing runs again.
    waiting, unacked = broker_empty(str(settings.broker_url))
    assert unacked == 0 and waiting <= gates
    if waiting:
        successor = start_worker()
        for gate_id in gate_ids:
            successor.wait_for(f"gate {gate_id} not pending (cancelled", 30)
        assert wait_acknowledged(str(settings.broker_url)) == (0, 0)
        assert successor.stop() == 0
    runs = [service.get_gate(factory, gate_id) for gate_id in gate_ids]
    for run in runs:
        assert (run.state, run.attempts) == ("cancelled", 1)
    assert find_processes(tag) == []
    left = find_processes(tag, keepers=True)
    fault_row(
        fault=f"worker SIGTERM (warm shutdown) with {gates} gate(s) running",
        operator_sees=_polled(runs[0], settings),
        final_state=f"{', '.join(f'{r.state}/{r.verdict}' for r in runs)}; the worker exited "
        f"{worker.proc.returncode} after {exited_s:.1f} s",
        gpus=gpus_cell(active_leases(factory), watch.summary()),
        orphans=len(left),
        lost=sum(r.state not in FINISHED for r in runs),
    )
