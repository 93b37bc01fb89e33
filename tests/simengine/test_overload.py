"""Continuous batching seen from outside: overload queues requests, and the queue drains.

Real process, real HTTP, bounds loose enough for a busy machine: the effect tested is tens of
times larger than scheduling noise.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from simengine.launch import SimPool

# serial: TTFT under overload is measured on the wall clock.
pytestmark = pytest.mark.serial

GREEDY = {"temperature": 0, "ignore_eos": True}


async def _ttft(client: httpx.AsyncClient, max_tokens: int) -> float:
    body = {"prompt": "a b c", "max_tokens": max_tokens, "stream": True, **GREEDY}
    start = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - start
    assert first is not None
    return first


async def _waiting(client: httpx.AsyncClient) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("vllm:num_requests_waiting{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no waiting gauge")


def test_ttft_rises_under_overload_and_recovers(launcher: SimPool) -> None:
    # Four sequences at a time, 5 ms steps: 20-token requests take ~100 ms each, so the
    # engine serves ~40 requests/s; 48 at once wait up to a dozen turns in the queue.
    sim = launcher.start("--profile", "tiny", "--max-num-seqs", "4", "--itl-ms", "5")
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)

    async def main() -> tuple[list[float], list[float], list[float], float]:
        async with httpx.AsyncClient(base_url=sim.url, timeout=30, limits=limits) as client:
            before = [await _ttft(client, 10) for _ in range(5)]
            burst = [asyncio.create_task(_ttft(client, 20)) for _ in range(48)]
            # The deepest queue /metrics showed while the burst was served: sampled until it
            # is done, since on a busy machine the burst may take a while to be sent at all.
            waiting = 0.0
            while not all(t.done() for t in burst) and waiting < 10:
                await asyncio.sleep(0.05)
                waiting = max(waiting, await _waiting(client))
            overloaded = await asyncio.gather(*burst)
            after = [await _ttft(client, 10) for _ in range(5)]
        return before, list(overloaded), after, waiting

    before, overloaded, after, waiting = asyncio.run(main())
    base = statistics.median(before)
    assert base < 0.1
    assert waiting >= 10  # the queue was visible on /metrics
    assert statistics.median(overloaded) > max(5 * base, 0.15)
    assert max(overloaded) > 0.6  # the last of the burst waited for about a dozen turns
    assert statistics.median(after) < 2 * base + 0.05  # back to normal once the load drops
