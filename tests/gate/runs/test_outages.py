"""Whole gates on real sim engines whose reservation lease fails: the gate stops its engines
before the lease could expire, holds with the true reason, and its document says the
reservation was lost, not released."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from gaterun import tiny_spec

from gate.core.settings import Settings
from gate.engines.launchers import TERM_GRACE_S
from gate.reservations import leases
from gate.reservations.service import teardown_margin_s
from gate.runs.engine_pair import engine_grace_s
from gate.runs.runner import run_gate
from gate.service import service

pytestmark = pytest.mark.slow

TTL_S = 3.0


def _gate(tmp_path: Path, tag: str) -> tuple[dict[str, Any], list[Any]]:
    spec = tiny_spec(tag, name="outage", rate=5, requests=300)
    db = f"sqlite:///{tmp_path / 'g.db'}"
    out = asyncio.run(
        run_gate(
            spec,
            Settings(data_dir=tmp_path / ".gate", lease_ttl_s=TTL_S),
            report_dir=tmp_path / "reports",
            db_url=db,
        )
    )
    from gate.core.database import make_engine, make_sessionmaker

    phases = service.all_phases(make_sessionmaker(make_engine(db)), out.gate_id)
    return out.document, phases


def _at(phases: list[Any], name: str) -> float:
    return next(p.at_s for p in phases if p.role == "gate" and p.phase == name)


def test_a_lease_that_cannot_be_renewed_stops_the_gate_before_it_expires(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(*args: object) -> bool:
        raise ConnectionError("could not connect to the database")

    monkeypatch.setattr(leases, "heartbeat", unreachable)
    doc, phases = _gate(tmp_path, tag)
    assert (doc["state"], doc["verdict"]) == ("error", "hold")
    assert doc["error"]["code"] == "lease_lost"
    assert "could not be renewed" in doc["reasons"][0]["message"]
    assert "ConnectionError" in doc["reasons"][0]["message"]
    assert doc["reservation"]["state"] == "lost"
    # Told before the TTL ran out, counted from the grant; torn down, then released.
    assert _at(phases, "lease_lost") - _at(phases, "reserved") < TTL_S
    assert _at(phases, "lease_lost") < _at(phases, "released")


def test_a_lease_ended_elsewhere_stops_the_gate_at_its_next_renewal(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(leases, "heartbeat", lambda *args: False)
    doc, phases = _gate(tmp_path, tag)
    assert doc["error"]["code"] == "lease_lost"
    assert "ended elsewhere" in doc["reasons"][0]["message"]
    assert doc["reservation"]["state"] == "lost"
    assert _at(phases, "lease_lost") - _at(phases, "reserved") < TTL_S


@pytest.mark.parametrize("ttl_s", [1.0, 3.0, 8.0, 12.0, 30.0, 50.0, 600.0, 3600.0])
def test_an_engines_teardown_fits_in_the_leases_teardown_margin(ttl_s: float) -> None:
    """A stop waits for an engine at most twice its grace (SIGTERM, then the keeper's SIGKILL
    and reaping), so with both engines stopped at once teardown ends inside the margin the
    lease keeps for it, whatever the TTL; long leases keep the full TERM_GRACE_S."""
    grace = engine_grace_s(ttl_s)
    assert 2 * grace <= teardown_margin_s(ttl_s)
    assert grace == TERM_GRACE_S or teardown_margin_s(ttl_s) < 3 * TERM_GRACE_S
