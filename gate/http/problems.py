"""The one way the service writes an error, and the one size limit on every answer it writes.

A review round sent 796 KB of `NaN` to any POST path and got a 29 MB 422 back (every NaN
named), before routing and before auth; 60,000 unknown fields got 6 MB, 60,000 Flagger metadata
keys 7.1 MB. An answer must never grow with what an unauthenticated caller sends, so:

- `problem()` is the only writer of the error shape. It names at most MAX_PROBLEMS mistakes and
  counts the rest ("and N more mistakes"), cuts each path, each mistake and the message, and
  drops named mistakes until the encoded answer fits MAX_ERROR_BYTES. Middleware (body limit,
  session guard, finite JSON) and every exception handler answer through it.
- `AnswerLimit`, the outermost middleware, holds every answer to a byte limit whoever wrote it:
  an error answer (status >= 400) to MAX_ERROR_BYTES, any answer to GATE_MAX_ANSWER_BYTES. An
  answer past its limit is replaced by a short error (logged), never sent whole. Answers are
  bounded by construction too (string caps in the spec, pages of gates), so this limit is the
  guard for what a future route forgets, not a way to cut honest answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gate.core.errors import MAX_PROBLEMS

log = logging.getLogger("gate.http")

MAX_ERROR_BYTES = 64 * 1024  # one error answer, encoded; 51 problems of the cuts below fit
MAX_PATH_CHARS = 120  # a problem's path (a caller's key may be 1 MB long)
MAX_PROBLEM_CHARS = 400  # a problem's message
MAX_MESSAGE_CHARS = 4_000  # the error's message


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and `…`."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def capped(problems: Sequence[Mapping[str, str]], total: int | None = None) -> list[dict[str, str]]:
    """The first MAX_PROBLEMS problems, each cut to size, and one that counts the rest (of
    `total`, when the caller listed only the first ones). A list already capped (MAX_PROBLEMS
    and its count: SpecError's) is kept as it is."""
    total = max(total or 0, len(problems))
    shown = [
        {
            "path": cut(str(p["path"]), MAX_PATH_CHARS),
            "message": cut(str(p["message"]), MAX_PROBLEM_CHARS),
        }
        for p in problems[: MAX_PROBLEMS + 1]
    ]
    if total > MAX_PROBLEMS + 1:
        shown[MAX_PROBLEMS:] = [_more(total - MAX_PROBLEMS)]
    return shown


def _more(n: int) -> dict[str, str]:
    return {"path": "(request)", "message": f"and {n} more mistake{'s' if n > 1 else ''}"}


def problem(
    status: int, code: str, message: str, problems: Sequence[Mapping[str, str]] | None = None
) -> JSONResponse:
    """The app's error shape: {"error": {"code", "message", "problems": [{"path", "message"}]}},
    at most MAX_ERROR_BYTES encoded whatever it is given."""
    error: dict[str, object] = {"code": code, "message": cut(message, MAX_MESSAGE_CHARS)}
    if problems is not None:
        error["problems"] = capped(problems)
    body = _encode(error)
    while len(body) > MAX_ERROR_BYTES:  # wide characters: up to 6 bytes each as \u escapes
        listed = error.get("problems")
        if isinstance(listed, list) and len(listed) > 1:
            keep = len(listed) // 2
            error["problems"] = [*listed[:keep], _more(len(problems or ()) - keep)]
        else:
            error["message"] = cut(str(error["message"]), len(str(error["message"])) // 2)
        body = _encode(error)
    return JSONResponse({"error": error}, status_code=status)


def mistakes(
    status: int,
    code: str,
    lead: str,
    problems: Sequence[Mapping[str, str]],
    total: int | None = None,
) -> JSONResponse:
    """An error naming its problems in the message too (`lead: path: message; ...`), both
    capped: the message is built from the problems shown, never from all of them. `total`:
    how many there are, when `problems` lists only the first ones."""
    shown = capped(problems, total)
    lines = "; ".join(f"{p['path']}: {p['message']}" for p in shown)
    return problem(status, code, f"{lead}: {lines}", shown)


def _encode(error: dict[str, object]) -> bytes:
    return json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":")).encode()


class ByteLimit:
    """An ASGI middleware that holds HTTP traffic to `limit` bytes in `limited`; every other
    scope (lifespan) passes through untouched."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.limited(scope, receive, send)

    async def limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class AnswerLimit(ByteLimit):
    """Hold every answer to a byte limit (MAX_ERROR_BYTES for an error, `limit` for any), by
    its Content-Length or, without one, by counting its body as it is written. An answer past
    it is replaced by a short error and logged; the body already written is never sent."""

    async def limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        start: Message | None = None
        held: list[Message] = []
        size = 0
        allowed = self.limit
        replaced = False

        async def bounded(message: Message) -> None:
            nonlocal start, size, allowed, replaced
            if replaced:
                return  # the rest of an answer already replaced
            if message["type"] == "http.response.start":
                start = message
                status = int(message["status"])
                allowed = min(self.limit, MAX_ERROR_BYTES) if status >= 400 else self.limit
                length = dict(message.get("headers", [])).get(b"content-length")
                if length is not None and length.isdigit() and int(length) > allowed:
                    replaced = True
                    await self._replace(scope, status, int(length), allowed, send)
                    return
                return  # held until its body is known to fit
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            size += len(message.get("body", b""))
            if size > allowed:
                replaced = True
                await self._replace(scope, int(start["status"]), size, allowed, send)
                return
            if message.get("more_body", False):
                held.append(message)
                return
            await send(start)
            for m in held:
                await send(m)
            held.clear()
            await send(message)

        await self.app(scope, receive, bounded)

    async def _replace(self, scope: Scope, status: int, size: int, limit: int, send: Send) -> None:
        log.error(
            "answer to %s %s refused: %s bytes or more, over the %s-byte limit",
            scope.get("method"),
            scope.get("path"),
            size,
            limit,
        )
        code = status if status >= 400 else 500
        resp = problem(
            code,
            "answer_too_large",
            f"the answer was larger than the {limit}-byte limit of this service's answers",
        )

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await resp(scope, nothing, send)
