"""An advisory check that fails and does not hold, through the real API: a whole sim gate
whose candidate lost a feature the reference has (stream usage), with the capability checks
advisory (`policy.advisory`). Argo Rollouts' dryRun is the model (argoproj/argo-rollouts
utils/analysis/helpers.go: `IsTerminating` skips a metric result marked DryRun, so a failed
dry-run metric never ends the analysis; `GetDryRunMetrics` refuses a rule that matches no
metric, "dryRun[%d]: Rule didn't match any metric name(s)"): here the gate continues, and the
terminal, the document, the report page, the polled verdict, the gate's view, the commit
status and re-judge all list the advisory failures apart."""

from __future__ import annotations

import io
from typing import Any

import pytest
from apitools import auth, poll_finished, spec_dict, write_named_spec
from fastapi.testclient import TestClient
from rich.console import Console

from gate.analysis.advisory import NEVER_ADVISORY, unmatched
from gate.analysis.policy import Policy
from gate.core.settings import Settings
from gate.integrations.callbacks import status_body
from gate.runs.console import print_summary
from gate.service.schemas import VerdictSummary
from gate.verdict.document import VerdictDocument

pytestmark = pytest.mark.slow

ADVISORY = ["compat.capability.*"]  # a new family of checks, brought in without blocking


def _terminal(doc: VerdictDocument) -> str:
    out = io.StringIO()
    print_summary(doc, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_an_advisory_regression_continues_listed_apart_everywhere(
    app_client: TestClient, settings: Settings, tokens: dict[str, str], tag: str
) -> None:
    # an operator's spec (any argv): the candidate lost stream usage (llama.cpp's habit)
    spec = spec_dict(tag, cand_flags=("--without", "stream_usage"), trusted=True)
    spec["policy"] |= {"advisory": ADVISORY}
    spec["correctness"] = "off"  # a load scenario only: 3 s of load
    write_named_spec(settings, "advisory", spec)
    run, read = auth(tokens["run"]), auth(tokens["read"])
    r = app_client.post("/v1/gates", json={"spec_name": "advisory"}, headers=run)
    assert r.status_code == 202, r.text
    gid = r.json()["id"]
    final = poll_finished(app_client, gid, tokens["read"])
    assert final["state"] == "complete", final

    # the document: a continue; the capability check failed, marked advisory, not a reason
    doc = VerdictDocument.model_validate(
        app_client.get(f"/v1/gates/{gid}/document", headers=read).json()
    )
    assert doc.verdict == "continue", doc.summary
    failed = [c.id for c in doc.checks if c.decision == "fail"]
    assert failed == ["compat.capability.stream_usage"], failed
    assert all(c.advisory for c in doc.checks if c.id.startswith("compat.capability."))
    assert not any(c.advisory for c in doc.checks if not c.id.startswith("compat.capability."))
    assert doc.reasons == []
    assert [a.check for a in doc.advisory] == failed
    assert doc.summary is not None and "advisory: " in doc.summary
    assert failed[0] in doc.summary
    assert not {r.check for r in doc.not_shown + doc.warnings} & set(failed)
    # every check this gate made is one the advisory families know (they cannot drift apart)
    made = [c.id for c in doc.checks if c.id not in NEVER_ADVISORY]
    assert unmatched(made, Policy(advisory=ADVISORY), ["steady"]) == []

    # the polled verdict and the gate's view carry the same list
    verdict = app_client.get(f"/v1/gates/{gid}/verdict", headers=read).json()
    assert verdict["verdict"] == "continue"
    assert [a["check"] for a in verdict["advisory"]] == failed
    assert verdict["advisory_omitted"] == 0
    assert [a["check"] for a in final["advisory"]] == failed
    # the commit status: success, its description the summary line naming the advisory failure
    status = status_body(VerdictSummary.model_validate(verdict), "gate")
    assert status["state"] == "success" and "advisory: " in status["description"]

    # the terminal
    said = _terminal(doc)
    assert "CONTINUE, " in said and "advisory check" in said
    assert f"advisory  {failed[0]}:" in said

    # the report page
    page = app_client.get(f"/gates/{gid}", headers=read)
    assert page.status_code == 200
    assert 'aria-label="advisory failures"' in page.text
    assert f'href="#check-{failed[0]}"' in page.text
    assert '<span class="pill advisory">advisory</span>' in page.text
    assert "which the policy lets pass" in page.text  # never "no regression was shown"

    # re-judge honours the policy it is given: without `advisory`, the same samples hold
    policy = dict(spec["policy"])  # the gate's own: short scenarios allowed, the advisory
    strict = {k: v for k, v in policy.items() if k != "advisory"}
    strict = app_client.post(f"/v1/gates/{gid}:rejudge", json={"policy": strict}, headers=run)
    assert strict.json()["verdict"] == "hold" and strict.json()["advisory"] == []
    assert [c["id"] for c in strict.json()["reasons"]] == failed
    again = app_client.post(f"/v1/gates/{gid}:rejudge", json={"policy": policy}, headers=run).json()
    assert again["verdict"] == "continue"
    assert {a["check"] for a in again["advisory"]} == set(failed)

    # a pattern that matches no check of this gate is refused, naming the field
    bad = app_client.post(
        f"/v1/gates/{gid}:rejudge",
        json={"policy": {"advisory": ["stedy.ttft.p90"]}},
        headers=run,
    )
    assert bad.status_code == 422, bad.text
    problem = bad.json()["error"]["problems"][0]
    assert problem["path"] == "policy.advisory[0]" and "stedy.ttft.p90" in problem["message"]


def test_a_spec_whose_advisory_pattern_matches_nothing_is_refused(
    app_client: TestClient, tokens: dict[str, str], tag: str
) -> None:
    def problems(patterns: list[str]) -> dict[str, str]:
        spec: dict[str, Any] = spec_dict(tag)
        spec["policy"]["advisory"] = patterns
        r = app_client.post("/v1/gates", json={"spec": spec}, headers=auth(tokens["run"]))
        assert r.status_code == 422, r.text
        return {p["path"]: p["message"] for p in r.json()["error"]["problems"]}

    # no scenario of this spec is called burst (its scenarios are steady and correctness)
    said = problems(["ttft.p90", "burst.ttft.p90"])
    assert list(said) == ["policy.advisory[1]"], said
    assert "'burst.ttft.p90' matches no check" in said["policy.advisory[1]"]
    assert "steady" in said["policy.advisory[1]"]
    # the test bed's own check is never advisory; a quantile the policy does not check
    said = problems(["steady.errors", "gate.environment"])
    assert "never advisory" in said["policy.advisory[1]"], said
    said = problems(["ttft.p99"])
    assert "p99" in said["policy"] and "advisory" in said["policy"], said
