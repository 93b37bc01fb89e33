"""Readiness as the gate sees it: port open, /health 200, the model listed in /v1/models.

Each step is a phase with its own timestamp, so a timeout says where an engine stuck.

Bounded, because the engine is the thing under test and may be broken or hostile:

- polls back off: the first wait is `POLL_S`, each poll that finds the phase not reached
  doubles it, up to `POLL_MAX_S`, and a new phase starts again at `POLL_S`. An engine that
  loads for ten minutes sees about one poll a second, not thirty; a phase reached is still
  noticed within the wait then current, and an engine that comes up fast is noticed fast;
- bodies are read up to a cap (`MAX_HEALTH_BODY_BYTES`, `MAX_MODELS_BODY_BYTES`), never whole;
- an engine's words reach an error or a phase detail only through `excerpt`: short, with
  control and non-printable characters escaped, so they cannot forge log lines or drive a
  terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httpx

from gate.core.errors import EngineError, EngineUnreachable, ReadinessTimeout
from gate.engines.lifecycle import PhaseLog
from loadgen.engine_text import excerpt as _excerpt

POLL_S = 0.05
"""The first wait between two polls of a phase, and the shortest."""

POLL_MAX_S = 1.0
"""The longest wait between two polls: how late, at most, a phase reached is noticed."""

MAX_HEALTH_BODY_BYTES = 4 << 10
"""The most of a /health answer that is read (4 KiB): only its status counts."""

MAX_MODELS_BODY_BYTES = 64 << 10
"""The most of a /v1/models answer that is read (64 KiB): vLLM's and SGLang's lists take a
few hundred bytes a model; a longer answer is an error naming this cap."""

EXCERPT_CHARS = 200
"""The longest quote of an engine's answer in an error or a phase detail."""


def excerpt(text: str | bytes, limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of an engine's answer, safe to print, log or store: the
    load generator's `excerpt` (control and non-printable characters escaped, a cut marked
    with `…`), which also takes the raw bytes of a body (decoded as UTF-8, errors replaced)."""
    if isinstance(text, bytes):
        text = text[: limit * 4 + 1].decode("utf-8", errors="replace")  # enough to see a cut
    return _excerpt(text, limit)


def next_wait(wait_s: float) -> float:
    """The wait after a poll that found its phase not reached: doubled, at most POLL_MAX_S."""
    return min(wait_s * 2, POLL_MAX_S)


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _get(client: httpx.AsyncClient, path: str, cap: int) -> tuple[int, bytes, bool]:
    """GET `path`: the status, at most `cap` bytes of the body, and whether it held more
    (the rest is not read; closing the response then drops the connection)."""
    async with client.stream("GET", path) as resp:
        parts: list[bytes] = []
        size = 0
        async for piece in resp.aiter_bytes():
            size += len(piece)
            if size > cap:
                parts.append(piece[: len(piece) - (size - cap)])
                return resp.status_code, b"".join(parts), True
            parts.append(piece)
        return resp.status_code, b"".join(parts), False


async def wait_ready(
    *,
    role: str,
    base_url: str,
    model: str,
    phases: PhaseLog,
    order: tuple[str, ...],
    timeout_s: float,
    connect_timeout_s: float | None = None,
    alive: Callable[[], str | None] | None = None,
) -> None:
    """Walk port_open -> healthy -> model_listed; raise naming the phase that did not finish.

    `alive` returns None while the engine process runs, else why it died; `connect_timeout_s`
    bounds the wait for the port (an attached endpoint that refuses connections is unreachable,
    not slow). Polls back off as the module says.
    """
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    walk = _Walk(role, phases, order, timeout_s, deadline, alive)

    port_deadline = deadline
    if connect_timeout_s is not None:
        port_deadline = min(deadline, time.monotonic() + connect_timeout_s)
    wait_s = POLL_S
    while not await _port_open(host, port):
        walk.check_alive()
        if time.monotonic() > port_deadline:
            if connect_timeout_s is not None and port_deadline < deadline:
                raise EngineUnreachable(
                    role, "port_open", f"unreachable: nothing accepts connections at {base_url}"
                )
            raise walk.timed_out("port_open")
        wait_s = await walk.pause(wait_s, port_deadline)
    phases.mark("port_open")

    timeout = httpx.Timeout(5.0)
    async with httpx.AsyncClient(
        base_url=base_url,
        timeout=timeout,
        trust_env=False,
        headers={"Accept-Encoding": "identity"},  # caps count the bytes that arrive
    ) as client:
        await _poll(walk, "healthy", lambda: _healthy(client))
        phases.mark("healthy")
        await _poll(walk, "model_listed", lambda: _model_listed(client, role, model))
        phases.mark("model_listed")


class _Walk:
    """One engine's walk to ready (`wait_ready`): its deadline, its liveness, its errors."""

    def __init__(
        self,
        role: str,
        phases: PhaseLog,
        order: tuple[str, ...],
        timeout_s: float,
        deadline: float,
        alive: Callable[[], str | None] | None,
    ) -> None:
        self.role, self.phases, self.order = role, phases, order
        self.timeout_s, self.deadline, self.alive = timeout_s, deadline, alive

    def check_alive(self) -> None:
        if self.alive is not None:
            why = self.alive()
            if why is not None:
                stuck = self.phases.stuck_in(self.order)
                raise EngineError(self.role, stuck, f"{why} during {stuck}")

    def timed_out(self, phase: str, last: str | None = None) -> ReadinessTimeout:
        why = f" ({last})" if last is not None else ""
        return ReadinessTimeout(
            self.role,
            phase,
            f"was not ready after {self.timeout_s:g}s: stuck in phase {phase}{why}",
        )

    async def pause(self, wait_s: float, until: float) -> float:
        """Sleep before the next poll (never past `until` by more than POLL_S); the next wait."""
        await asyncio.sleep(max(POLL_S, min(wait_s, until - time.monotonic())))
        return next_wait(wait_s)


async def _poll(walk: _Walk, phase: str, ask: Callable[[], Awaitable[str | None]]) -> None:
    """Ask until `ask` says done (None; else what it saw last), backing off, up to the
    deadline; the engine's death or the deadline raise naming `phase`."""
    wait_s = POLL_S
    while True:
        walk.check_alive()
        last = await ask()
        if last is None:
            return
        if time.monotonic() > walk.deadline:
            raise walk.timed_out(phase, last)
        wait_s = await walk.pause(wait_s, walk.deadline)


async def _healthy(client: httpx.AsyncClient) -> str | None:
    """None once /health answers 200, else what it answered."""
    try:
        status, body, _ = await _get(client, "/health", MAX_HEALTH_BODY_BYTES)
        if status == 200:
            return None
        return f"/health answered {status}" + (f": {excerpt(body)}" if body else "")
    except httpx.HTTPError as exc:
        return f"/health failed: {type(exc).__name__}"


async def _model_listed(client: httpx.AsyncClient, role: str, model: str) -> str | None:
    """None once /v1/models lists `model`, else what it answered; raises for an answer that
    lists other models or is too large."""
    try:
        status, body, more = await _get(client, "/v1/models", MAX_MODELS_BODY_BYTES)
        if status == 200:
            if more:
                raise EngineError(
                    role,
                    "model_listed",
                    f"/v1/models answered more than MAX_MODELS_BODY_BYTES "
                    f"({MAX_MODELS_BODY_BYTES} bytes): {excerpt(body)}",
                )
            ids = [m.get("id") for m in json.loads(body).get("data", [])]
            if model in ids:
                return None
            listed = excerpt(", ".join(str(i) for i in ids))
            raise EngineError(
                role,
                "model_listed",
                f"does not serve model {model!r}; /v1/models lists [{listed}]",
            )
        return f"/v1/models answered {status}" + (f": {excerpt(body)}" if body else "")
    except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
        return f"/v1/models failed: {type(exc).__name__}"
