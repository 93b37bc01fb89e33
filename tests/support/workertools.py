"""What the worker tests share: a gate spec on two sim engines, storing and queueing a gate,
waiting for one, counting held GPUs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import transaction
from gate.core.settings import Settings
from gate.core.vocabulary import FINISHED
from gate.models import GateRun, GpuLease
from gate.runs import store
from gate.spec import parse_spec
from gate.worker.dispatch import CeleryDispatcher


def sim(tag: str, *flags: str) -> list[str]:
    argv = ["python", "-m", "gate.engines.sim", "--port", "{port}", "--model", "{model}"]
    return [*argv, "--tag", tag, *flags]


def gate_spec(tag: str, *, requests: int, rate: float = 40.0) -> dict[str, Any]:
    """A gate on two sim engines. Long gates are 3000 requests at 20/s (150 s), not more:
    the load generator builds and checks every request on the event loop before the first
    one is sent, and that loop also beats the gate's heartbeat (100k requests stall it for
    10-20 s on two busy cores, longer than the SIGKILL test's 3 s `lost_after_s`)."""
    return {
        "name": "worker-test",
        "model": "demo-model",
        "reference": {"command": sim(tag, "--seed", "1")},
        "candidate": {"command": sim(tag, "--seed", "2")},
        "shape": {"sku": "H200", "gpus_per_engine": 1},
        "scenarios": [
            {
                "name": "steady",
                "arrival": "poisson",
                "rate": rate,
                "requests": requests,
                "prompt_tokens": 64,
                "max_tokens": 16,
            }
        ],
    }


def create(
    factory: sessionmaker[Session], spec: dict[str, Any], callback: dict[str, str] | None = None
) -> str:
    run, created = store.create_gate(
        factory, parse_spec(spec, "test spec"), source="test", callback=callback
    )
    assert created
    return run.id


def submit(settings: Settings, gate_id: str, times: int = 1) -> None:
    dispatcher = CeleryDispatcher(settings)
    for _ in range(times):
        dispatcher.submit(gate_id)
    dispatcher.close()


def wait_gate(
    factory: sessionmaker[Session],
    gate_id: str,
    until: Callable[[GateRun], bool],
    timeout: float,
) -> GateRun:
    t0 = time.monotonic()
    while True:
        run = store.get_gate(factory, gate_id)
        if until(run):
            return run
        if time.monotonic() - t0 > timeout:
            pytest.fail(
                f"gate {gate_id} still {run.state}/{run.phase} after {timeout}s ({run.reason})"
            )
        time.sleep(0.1)


def finished(run: GateRun) -> bool:
    return run.state in FINISHED


def measuring(run: GateRun) -> bool:
    """Both engines up and the scenario's load flowing."""
    return (
        run.state == "running"
        and (run.phase or "").startswith("scenario:")
        and bool(run.progress)
        and int((run.progress or {}).get("done", 0)) > 0
    )


def active_leases(factory: sessionmaker[Session]) -> int:
    with transaction(factory) as s:
        return int(s.scalar(select(func.count()).select_from(GpuLease)) or 0)
