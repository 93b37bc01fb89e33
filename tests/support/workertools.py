"""What the worker tests share: a gate spec on two sim engines, storing and queueing a gate,
waiting for one, counting held GPUs, and a real `gate serve` process."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import transaction
from gate.core.settings import Settings
from gate.core.vocabulary import FINISHED
from gate.models import GateRun, GpuLease
from gate.service import service
from gate.spec import parse_spec
from gate.worker.celery_dispatch import CeleryDispatcher


def sim(tag: str, *flags: str) -> list[str]:
    argv = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]
    return [*argv, "--tag", tag, *flags]


def gate_spec(tag: str, *, requests: int, rate: float = 40.0) -> dict[str, Any]:
    """A gate on two sim engines. Long gates are 3000 requests at 20/s (150 s), not more:
    the load generator builds and checks every request on the event loop before the first
    one is sent, and that loop also beats the gate's heartbeat (100k requests stall it for
    10-20 s on two busy cores, longer than the SIGKILL test's 3 s `lost_after_s`).

    The worker tests are about queues, claims and deaths, not the verdict: a scenario too
    short for the paired latency checks (fewer than 8 time blocks of 2 s) is allowed, its
    latency left undecided (fewer than 4 blocks cannot compare it at all, which holds)."""
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
        "policy": {"short_scenarios": "allow"},
    }


def create(
    factory: sessionmaker[Session], spec: dict[str, Any], callback: dict[str, str] | None = None
) -> str:
    run, created = service.create_gate(
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
        run = service.get_gate(factory, gate_id)
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


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a `gate serve` (or `gate worker`) process with these settings: the
    test's own, none of the caller's GATE_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env.update(
        {
            "GATE_DATABASE_URL": str(settings.database_url),
            "GATE_DATA_DIR": str(settings.data_dir),
            "GATE_HEARTBEAT_S": str(settings.heartbeat_s),
            "GATE_LOST_AFTER_S": str(settings.lost_after_s),
            "GATE_BROKER_VISIBILITY_TIMEOUT_S": str(settings.broker_visibility_timeout_s),
            "GATE_REQUEUE_AFTER_S": str(settings.requeue_after_s),
            "GATE_CALLBACK_ALLOW": json.dumps(settings.callback_allow),
            "GATE_PUBLIC_URL": settings.public_url,
        }
    )
    if settings.broker_url:
        env["GATE_BROKER_URL"] = str(settings.broker_url)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ApiProcess:
    """One `gate serve` subprocess on `port`, its log in a file."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float) -> float:
        """Seconds until the API answers; fails after `timeout` or if it exits."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                pytest.fail(f"gate serve exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/v1/openapi.json", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"gate serve not ready after {timeout}s:\n{self.log()[-4000:]}")

    def stop(self, timeout: float = 30.0) -> int:
        return stop_process(self.proc, timeout)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM, then SIGKILL after `timeout`; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def start_api(env: dict[str, str], log_path: Path, port: int, cwd: Path) -> ApiProcess:
    """`gate serve` on 127.0.0.1:`port` with `env` (see `service_env`); not waited for."""
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gate", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return ApiProcess(proc, log_path, port)
