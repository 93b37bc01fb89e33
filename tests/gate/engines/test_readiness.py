"""Readiness against engines on loopback that answer what the test says: polls back off, bodies
are read up to a cap, an engine's words are quoted only as a short escaped excerpt.

What is asserted is what the code guarantees (how many polls at most, what was read, what an
error says), never how long something took.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from gate.core.errors import EngineError, ReadinessTimeout
from gate.engines.lifecycle import ENDPOINT_PHASES, Clock, PhaseLog
from gate.engines.readiness import (
    EXCERPT_CHARS,
    MAX_MODELS_BODY_BYTES,
    POLL_MAX_S,
    POLL_S,
    excerpt,
    next_wait,
    wait_ready,
)

MODEL = "demo-model"

Answer = Callable[[int], tuple[int, bytes]]
"""The n-th request to a path (from 1) -> status and body."""


def ok_models(*ids: str) -> Answer:
    body = json.dumps({"object": "list", "data": [{"id": i} for i in ids]}).encode()
    return lambda n: (200, body)


@dataclass
class Engine:
    """/health and /v1/models answered by the test; `requests` counts them per path, and
    `complete` the answers written whole."""

    health: Answer = lambda n: (200, b"{}")
    models: Answer = field(default_factory=lambda: ok_models(MODEL))
    big_health_bytes: int = 0  # > 0: /health answers 200 with a body of this many bytes
    requests: dict[str, int] = field(default_factory=dict)
    complete: dict[str, int] = field(default_factory=dict)
    first_200_ns: dict[str, int] = field(default_factory=dict)
    url: str = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                path = head.split(b" ", 2)[1].decode()
                n = self.requests[path] = self.requests.get(path, 0) + 1
                if path == "/health" and self.big_health_bytes:
                    await self._big(writer, path)
                    continue
                status, body = (self.health if path == "/health" else self.models)(n)
                if status == 200:
                    self.first_200_ns.setdefault(path, time.monotonic_ns())
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                self.complete[path] = self.complete.get(path, 0) + 1
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.transport.abort()

    async def _big(self, writer: asyncio.StreamWriter, path: str) -> None:
        size = self.big_health_bytes
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n".encode())
        block = b"h" * (1 << 20)
        for _ in range(size // len(block) - 1):
            writer.write(block)
            await writer.drain()  # blocks for good once the client stops reading
        writer.write(block)  # the last, queued: counted before the client could have it
        self.complete[path] = self.complete.get(path, 0) + 1


def ready(engine: Engine, timeout_s: float = 10.0) -> tuple[PhaseLog, Engine]:
    """Run wait_ready against `engine` on loopback; returns the phases (or raises)."""

    async def main() -> PhaseLog:
        server = await asyncio.start_server(engine._handle, "127.0.0.1", 0)
        engine.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        phases = PhaseLog("candidate", Clock())
        try:
            phases.mark("attached")
            await wait_ready(
                role="candidate",
                base_url=engine.url,
                model=MODEL,
                phases=phases,
                order=ENDPOINT_PHASES,
                timeout_s=timeout_s,
            )
            return phases
        finally:
            server.close()  # asyncio.run then cancels the handlers still running

    return asyncio.run(main()), engine


def failure(engine: Engine, kind: type[EngineError], timeout_s: float) -> str:
    """The message of the `kind` error wait_ready raises against `engine`."""
    with pytest.raises(kind) as info:
        ready(engine, timeout_s)
    return info.value.message


def test_waits_double_from_poll_s_up_to_poll_max_s() -> None:
    waits = [POLL_S]
    for _ in range(12):
        waits.append(next_wait(waits[-1]))
    assert waits[:5] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8])
    assert max(waits) == POLL_MAX_S == 1.0
    assert waits[-1] == POLL_MAX_S


def test_an_unhealthy_engine_is_polled_with_backoff_and_quoted_as_an_excerpt() -> None:
    """3 s of 503s: with a fixed 0.05 s period that was some 60 polls; backing off to one a
    second it is at most a dozen. The engine's answer reaches the error escaped and short."""
    body = b"\x1b[31mwarming up\n" + b"x" * 10_000
    engine = Engine(health=lambda n: (503, body))
    message = failure(engine, ReadinessTimeout, timeout_s=3.0)
    assert 2 <= engine.requests["/health"] <= 12
    assert "stuck in phase healthy (/health answered 503: \\x1b[31mwarming up\\nxxx" in message
    assert message.isprintable() and len(message) < 150 + EXCERPT_CHARS


def test_a_phase_is_marked_by_the_first_poll_that_sees_it() -> None:
    """Failing polls back off, and the phase is marked at the poll that first sees it (not
    one poll later); the next phase starts polling afresh."""
    engine = Engine(
        health=lambda n: (200, b"{}") if n >= 5 else (503, b"no"),
        models=lambda n: ok_models(MODEL)(n) if n >= 3 else (503, b"loading"),
    )
    phases, engine = ready(engine)
    assert list(phases.reached) == list(ENDPOINT_PHASES)
    assert engine.requests == {"/health": 5, "/v1/models": 3}
    healthy_ns = phases.clock.start_ns + phases.reached["healthy"] * 1e9
    assert healthy_ns >= engine.first_200_ns["/health"] - 1e6  # float seconds: 1 ms of slack


def test_a_health_body_is_read_only_up_to_its_cap() -> None:
    """/health answers 200 with 64 MiB: healthy, and the body is not read whole."""
    engine = Engine(big_health_bytes=64 << 20)
    phases, engine = ready(engine)
    assert list(phases.reached) == list(ENDPOINT_PHASES)
    assert engine.requests["/health"] == 1
    assert engine.complete.get("/health", 0) == 0  # the client closed before it was all sent


def test_a_model_list_over_its_cap_is_an_error_naming_the_cap() -> None:
    pad = "p" * (MAX_MODELS_BODY_BYTES + 1)
    body = json.dumps({"data": [{"id": MODEL, "pad": pad}]}).encode()
    engine = Engine(models=lambda n: (200, body))
    message = failure(engine, EngineError, timeout_s=10.0)
    assert f"MAX_MODELS_BODY_BYTES ({MAX_MODELS_BODY_BYTES} bytes)" in message
    assert message.isprintable() and len(message) < 150 + EXCERPT_CHARS
    assert engine.requests["/v1/models"] == 1


def test_a_wrong_model_is_named_with_an_escaped_excerpt_of_the_list() -> None:
    engine = Engine(models=ok_models("\x1b]0;pwned\x07", "a" * 5_000))
    message = failure(engine, EngineError, timeout_s=10.0)
    assert f"does not serve model {MODEL!r}; /v1/models lists [\\x1b]0;pwned\\x07, aaa" in message
    assert message.isprintable() and len(message) < 100 + EXCERPT_CHARS


VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": MODEL,
            "object": "model",
            "created": 1735689600,
            "owned_by": "vllm",
            "root": "/models/Meta-Llama-3.1-8B-Instruct",
            "parent": None,
            "max_model_len": 131072,
            "permission": [
                {
                    "id": "modelperm-0b5b3c0e2f0f4c6c9d4f0a1e7b6d5c4b",
                    "object": "model_permission",
                    "created": 1735689600,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
    ]
    # LoRA adapters are listed as models of their own.
    + [
        {
            "id": f"adapter-{i}",
            "object": "model",
            "created": 1735689600,
            "owned_by": "vllm",
            "root": f"/adapters/adapter-{i}",
            "parent": MODEL,
            "max_model_len": 131072,
            "permission": [],
        }
        for i in range(50)
    ],
}
SGLANG_MODELS = {
    "object": "list",
    "data": [
        {
            "id": MODEL,
            "object": "model",
            "created": 1735689600,
            "owned_by": "sglang",
            "root": MODEL,
            "max_model_len": 32768,
        }
    ],
}


@pytest.mark.parametrize("listing", [VLLM_MODELS, SGLANG_MODELS], ids=["vllm", "sglang"])
def test_real_model_lists_fit_the_cap_and_parse(listing: dict[str, object]) -> None:
    body = json.dumps(listing).encode()
    assert len(body) < MAX_MODELS_BODY_BYTES
    phases, _ = ready(Engine(models=lambda n: (200, body)))
    assert list(phases.reached) == list(ENDPOINT_PHASES)


def test_excerpt_is_short_and_escaped() -> None:
    assert excerpt("ready ✓ ünï") == "ready ✓ ünï"
    assert excerpt(b"a\r\nb\x1b[2J\xffc\\") == "a\\r\\nb\\x1b[2J\ufffdc\\\\"
    assert excerpt("\u202eevil\u200b") == "\\u202eevil\\u200b"
    long = excerpt("y" * 10_000)
    assert len(long) == EXCERPT_CHARS and long.endswith("…")
    escaped = excerpt("\x07" * 1_000)
    assert len(escaped) <= EXCERPT_CHARS and escaped.isprintable() and escaped.endswith("…")
    assert excerpt("") == ""
