"""Posting a probe: one request with a byte cap on its answer and the target's deadline."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import httpx

from loadgen.client import (
    IDENTITY_HEADERS,
    Target,
    make_client,
    read_capped,
)
from loadgen.engine_text import excerpt

ProbeKind = Literal["completions", "chat"]


async def post_capped(
    http: httpx.AsyncClient, url: str, body: Mapping[str, Any], target: Target, cap: int
) -> tuple[int, bytes, bool]:
    """POST ``body``; the status, at most ``cap`` bytes of the answer and whether it held
    more, all within ``target.deadline_s`` (``TimeoutError`` past it). The answer is asked
    for uncompressed whatever the client (the cap counts decoded bytes)."""
    async with (
        asyncio.timeout(target.deadline_s),
        http.stream(
            "POST", url, json=body, headers=IDENTITY_HEADERS, timeout=target.timeout_s
        ) as response,
    ):
        payload, more = await read_capped(response, cap)
        return response.status_code, payload, more


def failure_text(exc: httpx.HTTPError | TimeoutError, target: Target) -> str:
    """A request that got no answer, said as a problem or an error."""
    if isinstance(exc, TimeoutError):
        return f"deadline: the request was not over after its deadline_s of {target.deadline_s:g} s"
    return f"{type(exc).__name__}: {excerpt(str(exc))}"


def over_cap(cap: int, name: str) -> str:
    return f"body over {name} ({cap} bytes): not read further"


def api_url(target: Target, api: ProbeKind) -> str:
    return dataclasses.replace(target, api=api).url


@contextlib.asynccontextmanager
async def client_for(
    target: Target, client: httpx.AsyncClient | None, connections: int = 2
) -> AsyncIterator[httpx.AsyncClient]:
    """The caller's client, or a fresh one (httpx's default transport: probes are few and
    some are not streams) closed afterwards."""
    if client is not None:
        yield client
        return
    async with make_client(target, max(2, connections), lean=False) as owned:
        yield owned
