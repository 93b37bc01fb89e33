"""Verdict alerts: how a finished gate is told to a Slack-compatible incoming webhook or to a
generic JSON webhook, and one delivery with a few quick retries (as the commit-status
callbacks, gate/integrations/callbacks.py: a 5xx or no answer is retried, a 4xx is final).

Slack's incoming webhooks take a JSON body with `text` (the notification's fallback, shown
where blocks cannot be) and `blocks` (layout blocks: `section` with a `mrkdwn` text object,
`context` with elements); mrkdwn escapes `&`, `<` and `>` as `&amp;`, `&lt;`, `&gt;`, and links
read `<url|label>` (docs.slack.dev/messaging/sending-messages-using-incoming-webhooks,
docs.slack.dev/messaging/formatting-message-text). A text object holds 1 to 3,000 characters
(docs.slack.dev/reference/block-kit/composition-objects/text-object); a message at most 50
blocks: the lists here are bounded far below (at most 5 sections). Mattermost and Rocket.Chat
take the same `text`.

The generic webhook gets `AlertPayload` (gate/service/schemas.py): the verdict summary every
surface shows, the engines compared, the report link; signed when GATE_ALERT_SECRET is set
(`X-Hub-Signature-256`, as the CI webhooks the gate receives, gate/integrations/signatures.py).

The service calls this with its typed objects, imported for annotations only: the service
depends on this module, never the other way round.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from gate.integrations import signatures

if TYPE_CHECKING:
    from gate.service.schemas import AlertPayload
    from gate.verdict.document import ReasonDoc

log = logging.getLogger("gate.integrations")

QUICK_TRIES = 3
SECTION_CHARS = 3_000  # Slack's limit on a section's text
LISTED = 5  # advisory failures and warnings named in a Slack message, each
ITEM_CHARS = 400  # each one's message: five fit a section with room for "and N more"


def mrkdwn(text: str) -> str:
    """Text as Slack's mrkdwn shows it literally (its three control characters escaped)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, chars: int = ITEM_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 3] + "..."


def _items(title: str, items: list[ReasonDoc], omitted: int) -> str:
    lines = [f"*{title}*"]
    lines += [f"• `{mrkdwn(r.check[:80])}`: {_clip(mrkdwn(r.message))}" for r in items[:LISTED]]
    more = len(items) - LISTED + omitted
    if more > 0:
        lines.append(f"_and {more} more_")
    text = "\n".join(lines)
    return text if len(text) <= SECTION_CHARS else text[: SECTION_CHARS - 3] + "..."


def slack_body(p: AlertPayload) -> dict[str, Any]:
    """Slack's incoming-webhook message: `text` for notifications, `blocks` for the layout."""
    v = p.verdict
    word = (v.verdict or v.state).upper()
    line = v.summary or v.reason or v.state
    text = f"{word}: gate {p.name} ({v.id}): {line} {v.report_url}"
    head = (
        f"*{word}* gate `{mrkdwn(p.name)}`: {mrkdwn(line)}\n"
        f"candidate `{mrkdwn(p.candidate or '?')}` against reference "
        f"`{mrkdwn(p.reference or '?')}`"
    )
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": head[:SECTION_CHARS]}}
    ]
    if v.verdict == "hold" and v.reason:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _reason(v.reason)}})
    for title, items, omitted in (
        ("Advisory checks that failed (they hold nothing)", v.advisory, v.advisory_omitted),
        ("Warnings", v.warnings, v.warnings_omitted),
    ):
        if items:
            blocks.append(
                {
                    "type": "section",
                    "text": {"type": "mrkdwn", "text": _items(title, items, omitted)},
                }
            )
    blocks.append(
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"<{v.report_url}|the gate's report>"}],
        }
    )
    return {"text": text, "blocks": blocks}


def _reason(reason: str) -> str:
    text = f"*Why*\n{mrkdwn(reason)}"
    return text if len(text) <= SECTION_CHARS else text[: SECTION_CHARS - 3] + "..."


@dataclass(frozen=True, slots=True)
class AlertSent:
    sent: bool  # the receiver took it (2xx)
    final: bool  # no point retrying: sent, or refused (a 4xx)
    posts: int  # HTTP requests made
    status: int | None  # the last HTTP status, None when nothing answered
    detail: str  # what happened, for the gate's record


def post_alert(
    url: str, fmt: str, payload: AlertPayload, secret: str | None, timeout_s: float = 10.0
) -> AlertSent:
    """POST one alert; up to QUICK_TRIES on no answer or a 5xx. Longer outages are the
    reapers' to retry (gate/service/alerts.py)."""
    body_obj = slack_body(payload) if fmt == "slack" else payload.model_dump(mode="json")
    body = json.dumps(body_obj, separators=(",", ":"), allow_nan=False).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "llm-deploy-gate"}
    if secret and fmt == "json":
        headers[signatures.HEADER] = signatures.sign(secret, body)
    status: int | None = None
    detail = "no answer"
    for attempt in range(1, QUICK_TRIES + 1):
        try:
            r = httpx.post(url, content=body, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            log.warning("alert to %s, try %d: no answer (%s)", url, attempt, type(exc).__name__)
            detail = f"no answer: {type(exc).__name__}"
            continue
        status = r.status_code
        if r.is_success:
            return AlertSent(True, True, attempt, status, f"sent: HTTP {status} (try {attempt})")
        if status < 500:
            return AlertSent(False, True, attempt, status, f"refused: HTTP {status}")
        detail = f"failed: HTTP {status}"
    return AlertSent(False, False, QUICK_TRIES, status, detail)
