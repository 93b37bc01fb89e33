"""The service's gate records: idempotent create, claim once, cancel, the reaper, listing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gate.core import clock
from gate.core.database import transaction
from gate.core.errors import GateConflict, GateNotFound
from gate.models import GateRun, GpuLease, Reservation
from gate.reservations import leases
from gate.reservations.allocator import ShapeRequest
from gate.reservations.inventory import load_inventory
from gate.service import service
from gate.spec import GateSpec, load_spec, parse_spec, spec_to_dict

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "specs").glob("*.yaml"))


def small_spec(name: str = "s", ttft: str = "20") -> GateSpec:
    return parse_spec(
        {
            "name": name,
            "model": "m",
            "reference": {"preset": "sim"},
            "candidate": {"preset": "sim", "args": ["--ttft-ms", ttft]},
            "scenarios": [{"name": "a", "rate": 5, "requests": 10}, {"suite": "compatibility"}],
        }
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_stored_specs_read_back_equal(path: Path, factory: sessionmaker[Session]) -> None:
    spec = load_spec(path)
    assert parse_spec(spec_to_dict(spec)) == spec
    run, _ = service.create_gate(factory, spec)
    assert parse_spec(service.get_gate(factory, run.id).spec) == spec


def test_key_is_the_same_for_the_same_spec_however_written() -> None:
    a = small_spec()
    b = parse_spec({**spec_to_dict(a), "seed": 0, "policy": {}})  # defaults spelt out
    assert service.spec_key(a) == service.spec_key(b)
    assert service.spec_key(a) != service.spec_key(small_spec(ttft="21"))


def test_create_with_a_key_is_idempotent(factory: sessionmaker[Session]) -> None:
    a, created_a = service.create_gate(factory, small_spec(), idempotency_key="k")
    b, created_b = service.create_gate(factory, small_spec(), idempotency_key="k")
    assert (created_a, created_b) == (True, False)
    assert a.id == b.id
    assert a.state == "pending"
    assert a.candidate_label == "sim --ttft-ms 20"


def test_a_key_never_hands_its_gate_to_another_spec_or_source(
    factory: sessionmaker[Session],
) -> None:
    service.create_gate(factory, small_spec(), idempotency_key="k")
    with pytest.raises(GateConflict, match="another spec"):
        service.create_gate(factory, small_spec("other"), idempotency_key="k")
    with pytest.raises(GateConflict):
        service.create_gate(factory, small_spec(), source="ci", idempotency_key="k")
    assert service.scoped_key("api", "a", "k") != service.scoped_key("api", "b", "k")
    assert service.scoped_key("api", "a", "k") != service.scoped_key("argo", "a", "k")
    assert service.scoped_key("api", "a\0k") != service.scoped_key("api", "a", "k")


def test_claim_runs_a_gate_once(factory: sessionmaker[Session]) -> None:
    run, _ = service.create_gate(factory, small_spec())
    first = service.claim(factory, run.id, "w1")
    assert first is not None and first.state == "running" and first.worker == "w1"
    assert service.claim(factory, run.id, "w2") is None  # a redelivery finds it taken
    assert service.get_gate(factory, run.id).worker == "w1"


def test_cancel_pending_running_and_finished(factory: sessionmaker[Session]) -> None:
    pending, _ = service.create_gate(factory, small_spec("p"))
    out = service.request_cancel(factory, pending.id, admin=True)
    assert (out.state, out.verdict) == ("cancelled", "hold")
    assert out.document is not None and out.document["reasons"][0]["check"] == "gate.cancelled"
    running, _ = service.create_gate(factory, small_spec("r"))
    service.claim(factory, running.id, "w")
    out = service.request_cancel(factory, running.id, admin=True)
    assert (out.state, out.cancel_requested) == ("running", True)  # the runner ends it
    with pytest.raises(GateConflict):
        service.request_cancel(factory, pending.id, admin=True)
    with pytest.raises(GateNotFound):
        service.request_cancel(factory, "missing", admin=True)


def test_reaper_ends_lost_gates_and_releases_their_gpus(factory: sessionmaker[Session]) -> None:
    lost, _ = service.create_gate(factory, small_spec("lost"))
    alive, _ = service.create_gate(factory, small_spec("alive"))
    for run in (lost, alive):
        service.claim(factory, run.id, f"worker-{run.name}")
    grant = leases.reserve(
        factory,
        load_inventory(None),
        ShapeRequest(sku="H200", gpus_per_engine=1),
        holder=f"gate:{lost.id}",
        gate_id=lost.id,
        ttl_s=600,
    )
    now = clock.now()
    with transaction(factory) as s:
        row = s.get(GateRun, lost.id)
        assert row is not None
        row.heartbeat_at = now - timedelta(seconds=120)
    ended = service.reap_lost(factory, lost_after_s=30, at=now)
    assert ended == [lost.id]
    row = service.get_gate(factory, lost.id)
    assert (row.state, row.verdict) == ("error", "hold")
    assert "worker-lost" in (row.reason or "") and "stopped sending heartbeats 120s ago" in (
        row.reason or ""
    )
    assert service.get_gate(factory, alive.id).state == "running"
    with transaction(factory) as s:
        assert s.scalars(select(GpuLease)).all() == []
        res = s.get(Reservation, grant.reservation_id)
        assert res is not None and res.state == "released" and res.release_reason == "worker lost"
    assert service.reap_lost(factory, lost_after_s=30, at=now) == []  # once


def test_list_filters_escape_like_wildcards(factory: sessionmaker[Session]) -> None:
    for name in ("a", "b", "c"):
        service.create_gate(factory, small_spec(name))
    rows, total = service.list_gates(factory, service.GateFilter(candidate="sim", limit=2))
    assert total == 3 and len(rows) == 2
    assert service.list_gates(factory, service.GateFilter(candidate="%"))[1] == 0
    assert service.list_gates(factory, service.GateFilter(candidate="_im"))[1] == 0
    assert service.list_gates(factory, service.GateFilter(name="b"))[1] == 1


def test_verdict_summary_keeps_the_gates_state() -> None:
    """The verdict object names the state as every endpoint does (issue 30: a cancelled gate
    read `error` here and `cancelled` in /v1/gates/{id}); a cancel is a hold all the same."""
    run = GateRun(id="x", state="cancelled", verdict="hold", reason="r", phase="finished")
    s = service.verdict_summary(run, "http://g/").model_dump(mode="json")
    assert s == {
        "id": "x",
        "state": "cancelled",
        "verdict": "hold",
        "reason": "r",
        "summary": "hold: r",  # no document: the row's reason
        "warnings": [],
        "warnings_omitted": 0,
        "not_shown": [],
        "not_shown_omitted": 0,
        "advisory": [],
        "advisory_omitted": 0,
        "report_url": "http://g/gates/x",
    }
    run = GateRun(id="y", state="running", verdict=None, reason=None, phase="scenario:a")
    running = service.verdict_summary(run, "http://g").model_dump(mode="json")
    assert running["verdict"] is None and running["summary"] is None


def test_verdict_summary_says_the_documents_words_in_bounded_lists(
    factory: sessionmaker[Session],
) -> None:
    """A finished gate's answer carries its summary line, warnings and what it did not show,
    from its stored document (an old one too); read_verdict (the pollers' path) says the same
    as the row; each list stops at ANSWER_ITEMS and counts the rest."""
    from dataclasses import replace

    from verdicts import CONTINUE_LINE, NOT_SHOWN, mixed_document, old_document

    from gate.verdict import check_doc
    from gate.verdict.summary import ANSWER_ITEMS

    doc = mixed_document(hold=False, gate_id="w1").to_json()
    many = [
        check_doc(replace(NOT_SHOWN, id=f"s{i}.ttft.p90", scenario=f"s{i}")).to_json()
        for i in range(ANSWER_ITEMS + 3)
    ]
    crowded = {**doc, "checks": doc["checks"] + many}
    with transaction(factory) as s:
        for gid, document in (("w1", doc), ("w2", old_document()), ("w3", crowded)):
            s.add(
                GateRun(
                    id=gid,
                    name="n",
                    spec={},
                    state="complete",
                    verdict="continue",
                    document=document,
                )
            )
    one = service.read_verdict(factory, "w1", "http://g").model_dump(mode="json")
    assert one == service.verdict_summary(service.get_gate(factory, "w1"), "http://g").model_dump(
        mode="json"
    )
    assert one["verdict"] == "continue" and one["summary"] == CONTINUE_LINE
    assert [w["check"] for w in one["warnings"]] == ["steady.itl.p50", "steady.errors"]
    assert one["not_shown"] == [
        {
            "check": "steady.ttft.p90",
            "message": "TTFT p90 in steady within +10% (shown: at most +14%)",
        }
    ]
    old = service.read_verdict(factory, "w2", "http://g").model_dump(mode="json")
    assert old["summary"] == (
        "continue; not shown: TTFT p90 in steady within +10% (shown: at most +14%)"
    )
    assert old["warnings"] == [] and len(old["not_shown"]) == 1
    full = service.read_verdict(factory, "w3", "http://g").model_dump(mode="json")
    assert len(full["not_shown"]) == ANSWER_ITEMS
    assert full["not_shown_omitted"] == 1 + ANSWER_ITEMS + 3 - ANSWER_ITEMS
    assert len(full["summary"]) <= 140 and full["summary"].endswith(" more)")
