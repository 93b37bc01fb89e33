"""The commit status a finished CI gate posts: the state stays binary, the description is the
gate's summary line (a continue with its warnings and the first thing it could not show), within
GitHub's 140 characters (longer is refused with a 422)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from verdicts import CONTINUE_LINE, HOLD_LINE, NOT_SHOWN, mixed_document

from gate.integrations.callbacks import status_body
from gate.models import GateRun
from gate.service import service
from gate.service.schemas import VerdictSummary
from gate.verdict import check_doc

GITHUB_LIMIT = 140


def _answer(verdict: str, document: dict | None, reason: str | None = None) -> VerdictSummary:  # type: ignore[type-arg]
    run = GateRun(
        id="g1",
        state="complete",
        phase="finished",
        verdict=verdict,
        reason=reason,
        document=document,
    )
    return service.verdict_summary(run, "https://gate.example")


@pytest.mark.parametrize("kind", ["github", "gitlab"])
def test_a_continue_with_warnings_says_so_and_what_was_not_shown(kind: str) -> None:
    body = status_body(_answer("continue", mixed_document(hold=False).to_json()), "ctx", kind)  # type: ignore[arg-type]
    assert body["state"] == "success"
    assert body["description"] == CONTINUE_LINE
    assert body["description"].startswith("continue, with 2 warnings; not shown: TTFT p90")
    assert body["target_url"] == "https://gate.example/gates/g1"


def test_a_hold_names_what_held_it() -> None:
    body = status_body(_answer("hold", mixed_document(hold=True).to_json()), "ctx")
    assert body == {
        "state": "failure",
        "description": HOLD_LINE,
        "target_url": "https://gate.example/gates/g1",
        "context": "ctx",
    }
    gitlab = status_body(_answer("hold", None, "gate deadline passed"), "ctx", "gitlab")
    assert gitlab["state"] == "failed" and gitlab["description"] == "hold: gate deadline passed"


def test_the_description_never_passes_githubs_limit() -> None:
    doc = mixed_document(hold=False).to_json()
    many = [
        check_doc(replace(NOT_SHOWN, id=f"scenario-{i}.ttft.p90", scenario=f"scenario-{i}"))
        for i in range(30)
    ]
    doc["checks"] += [c.to_json() for c in many]
    description = status_body(_answer("continue", doc), "ctx")["description"]
    assert len(description) <= GITHUB_LIMIT
    assert description.startswith(
        "continue, with 2 warnings; not shown: TTFT p90 in steady within +10% (shown: at most +14%)"
    )
    assert description.endswith("(and 30 more)")
    long_reason = "the lease could not be renewed: " + "x" * 400
    held = status_body(_answer("hold", None, long_reason), "ctx")["description"]
    assert len(held) == GITHUB_LIMIT and held.endswith("...")
    assert held.startswith("hold: the lease could not be renewed")
