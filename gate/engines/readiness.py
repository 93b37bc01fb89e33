"""Readiness as the gate sees it: port open, /health 200, the model listed in /v1/models.

Each step is a phase with its own timestamp, so a timeout says where an engine stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from gate.core.errors import EngineError, EngineUnreachable, ReadinessTimeout
from gate.engines.lifecycle import PhaseLog

POLL_S = 0.05


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


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
    not slow).
    """
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)

    def check_alive() -> None:
        if alive is not None:
            why = alive()
            if why is not None:
                raise EngineError(
                    role, phases.stuck_in(order), f"{why} during {phases.stuck_in(order)}"
                )

    def timed_out(phase: str) -> ReadinessTimeout:
        return ReadinessTimeout(
            role, phase, f"was not ready after {timeout_s:g}s: stuck in phase {phase}"
        )

    port_deadline = deadline
    if connect_timeout_s is not None:
        port_deadline = min(deadline, time.monotonic() + connect_timeout_s)
    while not await _port_open(host, port):
        check_alive()
        if time.monotonic() > port_deadline:
            if connect_timeout_s is not None and port_deadline < deadline:
                raise EngineUnreachable(
                    role, "port_open", f"unreachable: nothing accepts connections at {base_url}"
                )
            raise timed_out("port_open")
        await asyncio.sleep(POLL_S)
    phases.mark("port_open")

    timeout = httpx.Timeout(5.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, trust_env=False) as client:
        last = ""
        while True:
            check_alive()
            try:
                resp = await client.get("/health")
                if resp.status_code == 200:
                    break
                last = f"/health answered {resp.status_code}"
            except httpx.HTTPError as exc:
                last = f"/health failed: {type(exc).__name__}"
            if time.monotonic() > deadline:
                raise ReadinessTimeout(
                    role,
                    "healthy",
                    f"was not ready after {timeout_s:g}s: stuck in phase healthy ({last})",
                )
            await asyncio.sleep(POLL_S)
        phases.mark("healthy")

        while True:
            check_alive()
            try:
                resp = await client.get("/v1/models")
                if resp.status_code == 200:
                    ids = [m.get("id") for m in resp.json().get("data", [])]
                    if model in ids:
                        break
                    raise EngineError(
                        role,
                        "model_listed",
                        f"does not serve model {model!r}; /v1/models lists {ids}",
                    )
                last = f"/v1/models answered {resp.status_code}"
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                last = f"/v1/models failed: {type(exc).__name__}"
            if time.monotonic() > deadline:
                raise ReadinessTimeout(
                    role,
                    "model_listed",
                    f"was not ready after {timeout_s:g}s: stuck in phase model_listed ({last})",
                )
            await asyncio.sleep(POLL_S)
        phases.mark("model_listed")
