"""The API's verdict answers say a verdict as every surface does (issue 28 item 6): the small
object rollout controllers poll and the gate's view carry `summary`, `warnings` and `not_shown`,
bounded; `verdict` stays binary. Stored documents of finished gates, no engines."""

from __future__ import annotations

from typing import Any

from apitools import auth
from fastapi.testclient import TestClient
from verdicts import CONTINUE_LINE, ERRORS, HOLD_LINE, SLOWER, mixed_document, old_document

from gate.api.gates import GateView
from gate.core.database import transaction
from gate.models import GateRun
from gate.service.schemas import VerdictSummary


def _store(client: TestClient, gate_id: str, verdict: str, document: dict[str, Any]) -> None:
    factory = client.app.state.ctx.factory  # type: ignore[attr-defined]
    with transaction(factory) as s:
        s.add(
            GateRun(
                id=gate_id,
                name="mixed",
                spec={},
                state="complete",
                phase="finished",
                verdict=verdict,
                reason=" ".join(r["message"] for r in document["reasons"]) or None,
                document=document,
            )
        )


def test_the_verdict_object_of_a_continue_with_warnings(
    app_client: TestClient, tokens: dict[str, str]
) -> None:
    _store(app_client, "c1", "continue", mixed_document(hold=False, gate_id="c1").to_json())
    read = auth(tokens["read"])
    answer = app_client.get("/v1/gates/c1/verdict", headers=read).json()
    VerdictSummary.model_validate(answer)
    assert answer["verdict"] == "continue"  # what Argo's successCondition reads: binary
    assert answer["summary"] == CONTINUE_LINE
    assert answer["warnings"] == [
        {"check": "steady.itl.p50", "message": SLOWER.warning},
        {"check": "steady.errors", "message": ERRORS.warning},
    ]
    assert "not with confidence at 292" in answer["warnings"][1]["message"]
    assert answer["not_shown"] == [
        {
            "check": "steady.ttft.p90",
            "message": "TTFT p90 in steady within +10% (shown: at most +14%)",
        }
    ]
    assert answer["warnings_omitted"] == 0 and answer["not_shown_omitted"] == 0
    again = app_client.get("/v1/gates/c1/verdict", headers=read).json()  # the kept answer
    assert again == answer
    view = app_client.get("/v1/gates/c1", headers=read).json()
    GateView.model_validate(view)
    assert view["summary"] == CONTINUE_LINE
    assert view["warnings"] == answer["warnings"] and view["not_shown"] == answer["not_shown"]
    listed = app_client.get("/v1/gates", headers=read).json()["gates"]
    assert [g["summary"] for g in listed] == [CONTINUE_LINE]


def test_the_verdict_object_of_a_hold(app_client: TestClient, tokens: dict[str, str]) -> None:
    _store(app_client, "h1", "hold", mixed_document(hold=True, gate_id="h1").to_json())
    answer = app_client.get("/v1/gates/h1/verdict", headers=auth(tokens["read"])).json()
    assert answer["verdict"] == "hold" and answer["summary"] == HOLD_LINE
    assert answer["reason"].startswith("TTFT p50 in steady is 1.43x the reference")
    assert len(answer["warnings"]) == 2


def test_an_old_document_is_summarized_from_its_checks(
    app_client: TestClient, tokens: dict[str, str]
) -> None:
    _store(app_client, "o1", "continue", old_document())
    read = auth(tokens["read"])
    answer = app_client.get("/v1/gates/o1/verdict", headers=read).json()
    assert answer["summary"] == (
        "continue; not shown: TTFT p90 in steady within +10% (shown: at most +14%)"
    )
    assert answer["warnings"] == []
    doc = app_client.get("/v1/gates/o1/document", headers=read).json()
    assert doc["checks"][0]["decision"] == "undecided"  # stored 'inconclusive'


def test_a_running_gate_has_no_summary_yet(app_client: TestClient, tokens: dict[str, str]) -> None:
    factory = app_client.app.state.ctx.factory  # type: ignore[attr-defined]
    with transaction(factory) as s:
        s.add(GateRun(id="r1", name="n", spec={}, state="running", phase="scenario:steady"))
    answer = app_client.get("/v1/gates/r1/verdict", headers=auth(tokens["read"])).json()
    assert answer["verdict"] is None and answer["summary"] is None
    assert answer["warnings"] == [] and answer["not_shown"] == []


def test_the_openapi_document_describes_the_words(app_client: TestClient) -> None:
    schemas = app_client.app.openapi()["components"]["schemas"]  # type: ignore[attr-defined]
    for model in ("VerdictSummary", "GateView", "FlaggerAnswer"):
        props = schemas[model]["properties"]
        assert {"summary", "warnings", "not_shown", "warnings_omitted", "not_shown_omitted"} <= set(
            props
        ), model
