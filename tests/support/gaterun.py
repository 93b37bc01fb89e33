"""A real `gate run` in a subprocess on a SQLite file, and what the tests that break one share:
an engine with a grandchild that hides from its marks, a wait that tolerates a database not
there yet, the gate's row, and the whole-node grant that can only land on its GPUs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import reading
from gate.core.settings import Settings
from gate.models import GateRun
from gate.reservations import leases
from gate.reservations.allocator import ShapeRequest
from gate.reservations.inventory import load_inventory
from gate.runs.runner import GateOutcome, run_gate
from gate.spec import GateSpec, parse_spec

SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]

# An engine that first starts a grandchild in a session of its own with an empty environment
# (no mark, no CUDA_VISIBLE_DEVICES; as a tensor-parallel worker that calls setsid may), then
# becomes the sim engine. Its argv: the tag, the port, the model.
HIDDEN = (
    "import os, subprocess, sys; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]],"
    " start_new_session=True, env=dict()); "
    "os.execv(sys.executable, [sys.executable, '-m', 'simengine', '--port', sys.argv[2],"
    " '--model', sys.argv[3], '--tag', sys.argv[1]])"
)


def tiny_spec(tag: str, *, name: str, rate: float, requests: int, max_tokens: int = 4) -> GateSpec:
    """A gate of one steady scenario between two tiny sim engines tagged `tag`. The tests that
    use it break the gate's machinery, not its verdict, so a scenario too short for the paired
    latency checks (fewer than 8 time blocks) is allowed, its latency left undecided."""
    engine = {"command": [*SIM, "--tag", tag, "--profile", "tiny"]}
    scenario = {"name": "steady", "rate": rate, "requests": requests, "max_tokens": max_tokens}
    return parse_spec(
        {
            "name": name,
            "model": "demo-model",
            "reference": engine,
            "candidate": engine,
            "scenarios": [scenario],
            "policy": {"short_scenarios": "allow"},
        }
    )


def hidden_engine(tag: str) -> dict[str, list[str]]:
    return {"command": ["python", "-c", HIDDEN, tag, "{port}", "{model}"]}


def wait_for(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    """The first true value of `check`, polled; an exception counts as not yet (a database
    that is down, a schema not created yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if value := check():
                return value
        except Exception:  # not there yet: keep looking
            pass
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def start_gate_run(
    tmp_path: Path,
    engine: Mapping[str, Any],
    *,
    name: str,
    rate: float = 10,
    env: Mapping[str, str] | None = None,
    args: tuple[str, ...] = (),
    stdout: IO[bytes] | int = subprocess.DEVNULL,
    stderr: IO[bytes] | int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """`gate run` on both engines given as `engine`, one steady scenario of 400 requests, its
    database at tmp_path/gate.db, without the service's own GATE_* settings of this process."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: {name}\nmodel: demo-model\n"
        f"reference: {json.dumps(engine)}\ncandidate: {json.dumps(engine)}\n"
        f"scenarios: [{{name: steady, rate: {rate:g}, requests: 400, max_tokens: 4}}]\n"
    )
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GATE_")},
        "GATE_DATA_DIR": str(tmp_path / ".gate"),
        **(env or {}),
    }
    db = f"sqlite:///{tmp_path / 'gate.db'}"
    return subprocess.Popen(
        [sys.executable, "-m", "gate", "run", str(spec), "--db", db, *args],
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
    )


def the_gate(factory: sessionmaker[Session]) -> GateRun | None:
    """The database's one gate row (a `gate run` creates its own)."""
    with reading(factory) as s:
        return s.scalars(select(GateRun)).one_or_none()


def whole_node_grant(factory: sessionmaker[Session]) -> leases.Grant:
    """A second holder's grant of the whole default node (4 GPUs per engine): it fits only on
    the first gate's GPUs too, so landing at all means it got them."""
    return leases.reserve(
        factory,
        load_inventory(None),
        ShapeRequest(gpus_per_engine=4),
        holder="second",
        gate_id=None,
        ttl_s=60,
    )


def run_in_tmp(spec: GateSpec, tmp_path: Path) -> GateOutcome:
    """One whole gate in this process, everything it writes under `tmp_path` (its data
    directory, reports and SQLite database)."""
    return asyncio.run(
        run_gate(
            spec,
            Settings(data_dir=tmp_path / ".gate"),
            report_dir=tmp_path / "reports",
            db_url=f"sqlite:///{tmp_path / 'g.db'}",
        )
    )
