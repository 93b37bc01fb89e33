"""execute_gate in this process, on SQLite: what it does when the runner blows up, and when
the process is shutting down before it claims a gate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import transaction
from gate.core.errors import WorkerStopping
from gate.core.settings import Settings
from gate.demo import demo_spec_dict
from gate.models import GpuLease, Reservation
from gate.reservations import leases
from gate.reservations.allocator import ShapeRequest
from gate.reservations.inventory import load_inventory
from gate.runs.runner import GateRunner
from gate.service import execution, service
from gate.spec import parse_spec


@pytest.fixture
def local(tmp_path: Path, db_url: str) -> Iterator[tuple[Settings, sessionmaker[Session]]]:
    settings = Settings(database_url=db_url, data_dir=tmp_path / "data")
    f = execution.open_factory(settings)
    yield settings, f
    f.kw["bind"].dispose()


def pending_gate(f: sessionmaker[Session]) -> str:
    run, _ = service.create_gate(f, parse_spec(demo_spec_dict(requests=20), "test"), source="t")
    return run.id


def test_a_runner_that_raises_leaves_the_gate_ended_and_its_gpus_released(
    local: tuple[Settings, sessionmaker[Session]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, f = local
    gate_id = pending_gate(f)

    async def broken(self: GateRunner) -> None:
        # A bug after the reservation, before the runner's own teardown could release it.
        leases.reserve(
            f,
            load_inventory(None),
            ShapeRequest(gpus_per_engine=1),
            holder=f"gate:{self.gate_id}",
            gate_id=self.gate_id,
            ttl_s=600,
        )
        raise RuntimeError("boom")

    monkeypatch.setattr(GateRunner, "run", broken)
    assert execution.execute_gate(gate_id, settings, "worker@test:1", f) == "error"
    run = service.get_gate(f, gate_id)
    assert (run.state, run.verdict) == ("error", "hold")
    assert run.reason == "the gate failed on worker@test:1: RuntimeError: boom"
    assert run.document is not None and run.document["reasons"][0]["check"] == "gate.internal_error"
    with transaction(f) as s:
        assert list(s.scalars(select(GpuLease))) == []
        assert [r.state for r in s.scalars(select(Reservation))] == ["released"]
    # A second delivery of the same gate is a no-op.
    assert execution.execute_gate(gate_id, settings, "worker@test:2", f) == "skipped"


def test_a_stopping_process_claims_nothing(
    local: tuple[Settings, sessionmaker[Session]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, f = local
    gate_id = pending_gate(f)
    monkeypatch.setattr(execution, "_stopping", None)
    assert execution.stop_running_gates("shutting down") == []  # nothing runs here
    with pytest.raises(WorkerStopping):
        execution.execute_gate(gate_id, settings, "worker@test:1", f)
    run = service.get_gate(f, gate_id)
    assert (run.state, run.worker) == ("pending", None)  # left for another worker
