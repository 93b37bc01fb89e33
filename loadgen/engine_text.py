"""An engine's own words, made safe to quote: the engine is the thing under test.

:func:`excerpt` is the one way an engine's text (an error body, an error event, a probe's
answer) reaches a record's message, a log line or a page; :func:`error_message` finds the
human message in the error objects engines send, in a body or mid-stream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

EXCERPT_CHARS = 200
"""The longest quote of an engine's own words that goes into a record's message."""

MAX_MESSAGE = 500
"""The longest error message a record keeps."""


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """At most ``limit`` characters of an engine's words, safe to print, log or store.

    Control and other non-printable characters (newlines, terminal escapes, bidirectional
    overrides) and backslashes come out escaped as ``repr`` escapes them, so an engine cannot
    forge log lines or drive a terminal; a cut is marked with a final ``…``. HTML needs no
    escaping here: every page and report renders text through autoescaping templates.
    (``gate.engines.readiness.excerpt`` uses it for the gate's readiness answers.)
    """
    out: list[str] = []
    room = limit
    for i, char in enumerate(text):
        if i >= limit:
            break
        piece = char if char.isprintable() and char != "\\" else repr(char)[1:-1]
        if len(piece) > room:
            break
        out.append(piece)
        room -= len(piece)
    else:
        return "".join(out)
    while out and room < 1:  # make room for the mark of the cut
        room += len(out.pop())
    return "".join(out) + "…"


def error_message(obj: Mapping[str, Any]) -> str | None:
    """The human message of an OpenAI (``{"error": {...}}``) or older vLLM error object."""
    error = obj.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str):
            return message
        return json.dumps(error)[:MAX_MESSAGE]
    if isinstance(error, str):
        return error
    for key in ("message", "detail"):
        value = obj.get(key)
        if isinstance(value, str):
            return value
    return None
