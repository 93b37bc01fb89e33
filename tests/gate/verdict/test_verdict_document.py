"""The verdict document is one typed model: every way one is made, read back and written again,
gives the same JSON; a key the model does not know is refused naming it; the API's OpenAPI
describes the model itself; and no module outside gate/verdict spells the document as a dict."""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from gaterun import run_in_tmp, tiny_spec

from gate.analysis.checks import ratio_check, rule_check
from gate.analysis.types import Verdict
from gate.api.app import create_app
from gate.core.errors import DeadlinePassed, DocumentUnreadable, FieldProblem, SpecError
from gate.core.settings import Settings
from gate.verdict import (
    Evidence,
    Header,
    VerdictDocument,
    ended_document,
    gate_document,
    invalid_spec_document,
)
from gate.verdict.document import EngineDoc, ReservationBlocked

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _header() -> Header:
    return Header(
        gate_id="g1",
        name="steady-gate",
        model="demo-model",
        report="/r/steady-gate-g1.html",
        document="/r/steady-gate-g1.json",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=12),
        duration_s=12.34567,
    )


def _engines() -> dict[str, EngineDoc]:
    return {
        role: EngineDoc(
            kind="endpoint",
            url=f"http://127.0.0.1:{port}",
            pid=None,
            placement=None,
            kubernetes=None,
            phases={"attached": 0.01, "ready": 0.2},
            ready_s=None,
            crash=None,
            log=None,
            log_tail=[],
        )
        for role, port in (("reference", 8001), ("candidate", 8002))
    }


def _verdict(decision: str) -> Verdict:
    ttft = ratio_check(
        "steady.ttft.p50",
        "ttft",
        "pass" if decision == "continue" else "fail",
        "TTFT p50 ratio 1.30",
        scenario="steady",
        quantile=0.5,
        reference=40.0,
        candidate=52.0,
        ratio=1.3,
        interval=(1.2, float("inf")),
        threshold=1.1,
        samples=(500, 500),
        alpha=0.004,
    )
    crash = rule_check("crash.candidate", "crash", "crash", "pass", "no crash")
    reasons = () if decision == "continue" else (ttft,)
    return Verdict(decision, (ttft, crash), reasons, ("judge note",))  # type: ignore[arg-type]


def _round_trips(doc: VerdictDocument) -> dict[str, Any]:
    data = doc.to_json()
    assert json.loads(json.dumps(data, allow_nan=False)) == data  # plain JSON, no NaN
    again = VerdictDocument.read(data).to_json()
    assert again == data and list(again) == list(data)  # same keys, same order
    return data


def test_a_judged_gate_names_every_field_and_round_trips() -> None:
    evidence = Evidence(engines=_engines(), notes=["run note"])  # type: ignore[arg-type]
    data = _round_trips(gate_document(_header(), "complete", _verdict("hold"), None, evidence))
    assert set(data) == set(VerdictDocument.model_fields) - {"ended_elsewhere"}
    assert (data["verdict"], data["exit_code"], data["duration_s"]) == ("hold", 1, 12.346)
    assert data["reasons"] == [{"check": "steady.ttft.p50", "message": "TTFT p50 ratio 1.30"}]
    assert data["checks"][0]["interval"] == [1.2, None]  # an unbounded end reads as null
    assert data["notes"] == ["judge note", "run note"]  # the judge's, then the run's
    assert data["error"] is None and data["reservation"] is None
    ok = gate_document(_header(), "complete", _verdict("continue"), None, evidence)
    assert (ok.verdict, ok.exit_code, ok.reasons) == ("continue", 0, [])


def test_a_gate_stopped_by_an_error_holds_and_says_why() -> None:
    blocked = ReservationBlocked(
        state="blocked", code="no_capacity", message="no node has 8 free GPUs", retryable=True
    )
    evidence = Evidence(engines=_engines(), reservation=blocked)  # type: ignore[arg-type]
    err = DeadlinePassed("gate deadline of 60 s passed during the reservation")
    data = _round_trips(gate_document(_header(), "error", None, err, evidence))
    assert (data["verdict"], data["state"], data["exit_code"]) == ("hold", "error", 2)
    assert data["reasons"] == [{"check": "gate.deadline", "message": err.message}]
    assert data["error"] == {"code": "deadline", "message": err.message}
    assert data["checks"] == [] and data["reservation"]["state"] == "blocked"
    cancelled = gate_document(_header(), "cancelled", None, err, evidence)
    assert cancelled.exit_code == 130


def test_a_gate_ended_from_outside_carries_only_what_is_known() -> None:
    doc = ended_document("g2", "n", "error", "gate.worker_lost", "no heartbeat for 40 s", T0)
    data = _round_trips(doc)
    assert list(data) == [
        "gate_id",
        "name",
        "state",
        "verdict",
        "summary",
        "reasons",
        "checks",
        "notes",
        "error",
        "finished_at",
        "exit_code",
    ]
    assert data["error"] == {"code": "worker_lost", "message": "no heartbeat for 40 s"}
    assert data["summary"] == "hold: no heartbeat for 40 s"


def test_a_refused_spec_is_a_hold_naming_every_mistake() -> None:
    exc = SpecError([FieldProblem("scenarios[0].rate", "must be > 0"), FieldProblem("x", "?")])
    data = _round_trips(invalid_spec_document(exc))
    assert (data["state"], data["verdict"], data["exit_code"]) == ("invalid", "hold", 2)
    assert data["summary"] == "hold: spec has 2 mistakes"
    assert [r["check"] for r in data["reasons"]] == ["spec.scenarios[0].rate", "spec.x"]
    assert "gate_id" not in data and data["report"] is None


def test_a_key_the_model_does_not_know_is_refused_by_name() -> None:
    good = ended_document("g3", "n", "error", "gate.x", "m", T0).to_json()
    with pytest.raises(DocumentUnreadable, match=r"gate g3 .*verdit: Extra inputs"):
        VerdictDocument.read({**good, "verdit": "continue"})
    with pytest.raises(DocumentUnreadable, match="verdict: Input should be 'continue' or 'hold'"):
        VerdictDocument.read({**good, "verdict": "maybe"})


def test_an_unreadable_stored_document_is_served_as_stored_and_named_on_its_page(
    tmp_path: Path,
) -> None:
    """A document another version wrote (a key this one does not know): the API serves what
    was stored, the page says plainly why it cannot show it, and re-judge names it."""
    from fastapi.testclient import TestClient

    from gate.access.tokens import create_token
    from gate.analysis.policy import Policy
    from gate.core.database import open_migrated, transaction
    from gate.models import GateRun
    from gate.service.rejudge import rejudge

    settings = Settings(data_dir=tmp_path / ".gate")
    factory = open_migrated(settings.resolved_database_url())
    stored = {**ended_document("g4", "n", "error", "gate.x", "m", T0).to_json(), "future": 1}
    with transaction(factory) as s:
        s.add(GateRun(id="g4", name="n", spec={}, state="error", verdict="hold", document=stored))
    token = create_token(factory, "reader", ["read"])
    with TestClient(create_app(settings)) as client:
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/v1/gates/g4/document", headers=auth).json() == stored
        page = client.get("/gates/g4", headers=auth)
        assert page.status_code == 500 and "future: Extra inputs" in page.text
    with pytest.raises(DocumentUnreadable, match="future"):
        rejudge(factory, "g4", Policy())


def test_the_openapi_document_describes_the_model_itself(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / ".gate"))
    api = app.openapi()
    answer = api["paths"]["/v1/gates/{gate_id}/document"]["get"]["responses"]["200"]
    ref = answer["content"]["application/json"]["schema"]["$ref"]
    schemas = api["components"]["schemas"]
    served = schemas[ref.rsplit("/", 1)[-1]]
    assert set(served["properties"]) == set(VerdictDocument.model_fields)
    assert served.get("additionalProperties") is False
    assert "EngineDoc" in schemas and "CheckDoc" in schemas


def _document_literals(path: Path) -> list[int]:
    """Lines of dict literals with the document's own keys: a verdict, its reasons, checks."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"verdict", "reasons", "checks"} <= keys:
                out.append(node.lineno)
    return out


def test_no_module_outside_gate_verdict_spells_the_document_as_a_dict() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "gate").rglob("*.py"))
        if "verdict" not in path.relative_to(ROOT).parts
        for line in _document_literals(path)
    ]
    assert not offences, "build the verdict document with gate/verdict:\n" + "\n".join(offences)


def test_the_literal_finder_sees_a_document_dict(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        'doc = {"verdict": "hold", "reasons": [], "checks": []}\n'
        'view = {"verdict": "hold", "reasons": []}\n'
    )
    assert _document_literals(path) == [1]


@pytest.mark.slow
def test_a_real_gates_document_round_trips_and_matches_its_file(tmp_path: Path, tag: str) -> None:
    spec = tiny_spec(tag, name="roundtrip", rate=40, requests=60, max_tokens=8)
    out = run_in_tmp(spec, tmp_path)
    data = _round_trips(out.doc)
    beside = json.loads(Path(str(data["document"])).read_text())
    assert beside == data
    assert set(data["engines"]) == {"reference", "candidate"}
    assert data["engines"]["reference"]["kind"] == "process"
    assert data["reservation"]["state"] == "released"
