"""The Slack message of a held gate, pure: the reason under "Why", advisory failures and
warnings listed apart and bounded, every text escaped as mrkdwn wants (docs.slack.dev/
messaging/formatting-message-text: `&`, `<`, `>` as `&amp;`, `&lt;`, `&gt;`, so an engine's
message cannot ping `<!channel>`) and within a text object's 3,000 characters
(docs.slack.dev/reference/block-kit/composition-objects/text-object)."""

from __future__ import annotations

from gate.integrations.alerts import LISTED, slack_body
from gate.service.schemas import AlertPayload, VerdictSummary
from gate.verdict.document import ReasonDoc


def _payload(**verdict: object) -> AlertPayload:
    base: dict[str, object] = {
        "id": "g1",
        "state": "complete",
        "verdict": "hold",
        "reason": "TTFT p90 <!channel> & more",
        "summary": "hold: 1 check failed (steady.ttft.p90)",
        "warnings": [],
        "warnings_omitted": 0,
        "not_shown": [],
        "not_shown_omitted": 0,
        "report_url": "http://gate.test/gates/g1",
    }
    return AlertPayload(
        name="nightly",
        candidate="vllm:0.9",
        reference="vllm:0.8",
        verdict=VerdictSummary.model_validate(base | verdict),
    )


def test_a_hold_says_why_escaped_and_lists_advisory_failures_apart() -> None:
    advisory = [ReasonDoc(check=f"steady.itl.p{i}", message="x" * 900) for i in range(8)]
    body = slack_body(_payload(advisory=advisory, advisory_omitted=3))
    assert body["text"].startswith("HOLD: gate nightly (g1): hold: 1 check failed")
    texts = [b["text"]["text"] for b in body["blocks"] if "text" in b]
    assert texts[1] == "*Why*\nTTFT p90 &lt;!channel&gt; &amp; more"
    assert texts[2].startswith("*Advisory checks that failed (they hold nothing)*")
    assert texts[2].count("• `steady.itl.p") <= LISTED and "and 6 more" in texts[2]
    assert all(0 < len(t) <= 3000 for t in texts)
    assert "<" not in "".join(texts[:3]).replace("<http", "")


def test_a_continue_has_no_why() -> None:
    body = slack_body(_payload(verdict="continue", reason=None, summary="continue"))
    assert [b["type"] for b in body["blocks"]] == ["section", "context"]
    assert body["text"] == "CONTINUE: gate nightly (g1): continue http://gate.test/gates/g1"
