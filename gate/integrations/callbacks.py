"""Commit-status callbacks: when a gate started by the CI webhook ends, POST its verdict to
the URL the delivery named, only if that URL is on the allow-list (GATE_CALLBACK_ALLOW).

The service calls this with its typed answer (`VerdictSummary`, `CallbackTarget`: gate/service
/schemas.py), imported for annotations only: the service depends on this module, never the
other way round."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import httpx

from gate.core.settings import Settings
from gate.verdict.summary import LINE_CHARS as DESCRIPTION_CHARS
from gate.verdict.summary import stored_summary

if TYPE_CHECKING:
    from gate.service.schemas import CallbackTarget, VerdictSummary

log = logging.getLogger("gate.integrations")

STATE = {"continue": "success", "hold": "failure"}
Provider = Literal["github", "gitlab"]


def allowed(url: str, allow: list[str]) -> bool:
    """A URL is allowed when an allow-list entry has the same scheme and host (and port), and
    the URL's path starts with the entry's path: `https://api.github.com/repos/acme/` allows
    that organisation's status URLs, never `https://api.github.com.evil.example/...`."""
    try:
        u = urlsplit(url)
    except ValueError:
        return False
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password:
        return False
    if any(seg in ("..", ".") or "%2e" in seg.lower() for seg in u.path.split("/")):
        return False
    for entry in allow:
        try:
            a = urlsplit(entry)
        except ValueError:
            continue
        if a.scheme != u.scheme or not a.netloc or a.netloc.lower() != u.netloc.lower():
            continue
        prefix = a.path or "/"
        if not prefix.endswith("/"):  # `/repos/acme` allows `/repos/acme/...`, not `acme-evil`
            if u.path == prefix:
                return True
            prefix += "/"
        if u.path.startswith(prefix):
            return True
    return False


def provider(url: str) -> Provider:
    """Which commit-status API a callback URL is: GitLab's live under `/api/v4/projects/`
    (`POST /projects/:id/statuses/:sha`); anything else gets GitHub's shape."""
    return "gitlab" if "/api/v4/projects/" in urlsplit(url).path else "github"


def status_body(summary: VerdictSummary, context: str, kind: Provider = "github") -> dict[str, Any]:
    """The commit status for a finished gate. GitHub: `state` success|failure|error and
    `context`; GitLab: `state` success|failed (it has no `error`) and `name`. The state is
    binary; the description is the gate's summary line ("continue, with 2 warnings; not shown:
    TTFT p90 in steady within +10% (shown: at most +14%)", "hold: 2 checks failed (...)"),
    which gate/verdict/summary.py keeps within GitHub's 140 characters (a longer description
    is refused: 422 "description is too long (maximum is 140 characters)")."""
    verdict = summary.verdict
    line = summary.summary or stored_summary(verdict, None, summary.reason).line()
    description = str(line)[:DESCRIPTION_CHARS]
    if kind == "gitlab":
        return {
            "state": "success" if verdict == "continue" else "failed",
            "name": context,
            "description": description,
            "target_url": summary.report_url,
        }
    return {
        "state": STATE.get(str(verdict), "error"),
        "description": description,
        "target_url": summary.report_url,
        "context": context,
    }


@dataclass(frozen=True, slots=True)
class Delivery:
    sent: bool  # the receiver took it (2xx)
    final: bool  # no point retrying: sent, or refused (a 4xx, or not on the allow-list)
    detail: str  # what happened, for the gate's record


def deliver_callback(
    callback: CallbackTarget, summary: VerdictSummary, settings: Settings
) -> Delivery:
    """POST the commit status; a few quick retries on no answer or a 5xx. Longer outages are
    the reapers' to retry (`gate.service.notify`)."""
    url = callback.url
    if not allowed(url, settings.callback_allow):  # checked at receipt too; settings may change
        log.warning("callback %s is not on the allow-list: not sent", url)
        return Delivery(False, True, "not sent: the URL is not on the allow-list")
    headers = {"Accept": "application/json", "User-Agent": "llm-deploy-gate"}
    if settings.callback_token:
        headers["Authorization"] = f"Bearer {settings.callback_token}"
    body = status_body(summary, callback.status_context, provider(url))
    detail = "no answer"
    for attempt in range(3):
        try:
            r = httpx.post(url, json=body, headers=headers, timeout=10.0, follow_redirects=False)
        except httpx.HTTPError as exc:
            log.warning("callback %s attempt %d failed: %s", url, attempt + 1, exc)
            detail = f"no answer: {type(exc).__name__}"
            continue
        log.info("callback %s answered %d", url, r.status_code)
        if r.is_success:
            return Delivery(True, True, f"sent: HTTP {r.status_code}")
        if r.status_code < 500:
            return Delivery(False, True, f"refused: HTTP {r.status_code}")
        detail = f"failed: HTTP {r.status_code}"
    return Delivery(False, False, detail)
