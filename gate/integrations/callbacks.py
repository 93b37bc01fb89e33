"""Commit-status callbacks: when a gate started by the CI webhook ends, POST its verdict to
the URL the delivery named, only if that URL is on the allow-list (GATE_CALLBACK_ALLOW)."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

import httpx

from gate.core.settings import Settings

log = logging.getLogger("gate.integrations")

STATE = {"continue": "success", "hold": "failure"}


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
        if u.path.startswith(a.path or "/"):
            return True
    return False


def status_body(summary: dict[str, Any], context: str) -> dict[str, Any]:
    """GitHub's commit-status shape (GitLab's is close: it takes `state` and `description`)."""
    verdict = summary.get("verdict")
    state = STATE.get(str(verdict), "error")
    reason = str(summary.get("reason") or "")
    return {
        "state": state,
        "description": (f"gate {verdict or summary.get('state')}: {reason}")[:140],
        "target_url": summary.get("report_url"),
        "context": context,
    }


def deliver_callback(callback: dict[str, Any], summary: dict[str, Any], settings: Settings) -> bool:
    url = str(callback.get("url", ""))
    if not allowed(url, settings.callback_allow):  # checked at receipt too; settings may change
        log.warning("callback %s is not on the allow-list: not sent", url)
        return False
    headers = {"Accept": "application/json", "User-Agent": "llm-deploy-gate"}
    if settings.callback_token:
        headers["Authorization"] = f"Bearer {settings.callback_token}"
    body = status_body(summary, str(callback.get("context") or "llm-deploy-gate"))
    for attempt in range(3):
        try:
            r = httpx.post(url, json=body, headers=headers, timeout=10.0, follow_redirects=False)
            if r.status_code < 500:
                ok = r.is_success
                log.info("callback %s answered %d", url, r.status_code)
                return ok
        except httpx.HTTPError as exc:
            log.warning("callback %s attempt %d failed: %s", url, attempt + 1, exc)
    return False
