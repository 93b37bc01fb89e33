"""Send one streaming request to an OpenAI-compatible engine and record what came back, when.

Timing: ``sent_ns`` is taken immediately before the request is handed to httpx, and each socket
read is stamped with ``time.monotonic_ns()`` as it arrives; every event parsed out of that read
shares its stamp. Stamping reads rather than parsed lines keeps parser cost out of the numbers.

Token counting per event, most exact first:

1. the delta of ``usage.completion_tokens`` between events, when the server honours
   ``stream_options.continuous_usage_stats`` (vLLM does): exact, whatever the chunking;
2. the length of the event's ``token_ids`` (vLLM's ``return_token_ids``), else the number of
   chosen-token logprobs it carries (when logprobs were requested);
3. otherwise 1 per event with non-empty content. This fallback is wrong for servers that pack
   several tokens into one event: ITL is then per event rather than per token. ``output_tokens``
   still ends up exact when the server sends the final usage chunk, since that overrides the
   per-event sum.

An event "carries content" when it carries at least one token by that count, so the role-only
first chat chunk (``delta: {"role": "assistant", "content": ""}``) is never the first token.
Reasoning deltas (``reasoning_content``/``reasoning``) count as tokens but are not added to
``text``, which holds only the answer.

Each event is read by :class:`~loadgen.stream_state.StreamState`; an engine's words reach a
message only through :func:`~loadgen.engine_text.excerpt`.

Failures never raise: they come back as a record with ``error_kind`` set, so one bad request
cannot end a load run. Only cancellation propagates.

Everything an engine sends is bounded, because the engine is the thing under test: a request
ends at ``Target.deadline_s`` however it trickles; an SSE line or event is capped by
:mod:`loadgen.sse`; an error body is read up to :data:`MAX_ERROR_BODY_BYTES` and quoted only as
an :func:`excerpt`; a body read whole (:func:`read_capped`, for the probes) stops at its cap.
A response abandoned at a cap is closed, never its connection reused.

Client CPU cost: with the lean transport (``loadgen.transport``, the default for http
targets) a 64-token stream costs about 3 ms of client CPU on this two-core class of machine
(~40 us per streamed event: JSON decoding, SSE framing, the event loop), against ~8 ms with
httpx's default transport. ``dispatch_delay_ms`` is always reported so that a client that
fell behind shows it; ``--workers`` spreads one schedule over processes.

Connection pooling: :func:`make_client` builds one ``httpx.AsyncClient`` per target with explicit
limits sized by the caller to the most requests that can be in flight, so the client never
queues requests where no timestamp can see them. Body events are stamped with the receive time
of the socket read that delivered them, and ``sent_ns`` is the instant the request was written
to the socket (both from the lean transport; with another transport, the times around httpx).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from loadgen.engine_text import error_message, excerpt
from loadgen.prompts import chat_messages
from loadgen.records import ErrorKind, RequestRecord
from loadgen.sse import SSELimitError, SSEParser
from loadgen.stream_state import StreamState
from loadgen.tap import StreamTap
from loadgen.transport import SEND_AT, LoadgenTransport

Api = Literal["completions", "chat"]

_DRAIN_S = 1.0
# Idle pooled connections are retired after this long: under uvicorn's 5 s idle close (vLLM's
# VLLM_HTTP_TIMEOUT_KEEP_ALIVE), which it never announces.
_KEEPALIVE_S = 4.0

MAX_BODY_BYTES = 8 << 20
"""The most of a non-streaming answer that is read (8 MiB): a probe's or a greedy check's
completion is a few KiB, and an engine that answers without end must not fill our memory."""

MAX_ERROR_BODY_BYTES = 64 << 10
"""The most of an error answer (a non-2xx status, a JSON body where a stream was asked for)
that is read (64 KiB): enough for any real error document; only an :func:`excerpt` of its
message is kept."""


@dataclass(frozen=True, slots=True)
class Target:
    """One engine endpoint; ``name`` keys its records, so it must be unique within a run.

    ``timeout_s`` bounds connecting, each wait between two reads and the wait for a pooled
    connection, not the whole request: a long healthy stream must not time out, a stalled one
    must. ``deadline_s`` bounds the whole request, from the instant its bytes leave: an engine
    that trickles a byte just inside ``timeout_s`` would otherwise hold it (and the gate's
    GPUs) forever. Set it above the longest healthy request a run can send.
    """

    name: str
    base_url: str
    api: Api = "completions"
    model: str = "demo-model"
    timeout_s: float = 60.0
    deadline_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url: must be an http(s) URL, got {self.base_url!r}")
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api: must be 'completions' or 'chat', got {self.api!r}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s: must be a finite number > 0, got {self.timeout_s!r}")
        if not (self.deadline_s > 0 and math.isfinite(self.deadline_s)):
            raise ValueError(f"deadline_s: must be a finite number > 0, got {self.deadline_s!r}")

    @property
    def url(self) -> str:
        """The endpoint; a ``base_url`` given with or without ``/v1`` both work."""
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + ("/completions" if self.api == "completions" else "/chat/completions")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send; ``extra`` is merged into the body (ignore_eos, temperature, seed,
    logprobs, return_token_ids ...), except the keys the load generator sets itself
    (:data:`GATE_SET_KEYS`: model, prompt/messages, stream, stream_options, max_tokens).

    ``messages`` replaces the single user message built from ``prompt`` (chat history from a
    trace or a dataset); on the completions API they are flattened into one prompt. ``parent``
    makes the request the next turn of a conversation: it is sent only after the parent has
    finished on the same target, with the parent's messages and that target's own answer
    before ``prompt``, as a user of a chat application would, ``think_s`` seconds after that
    answer (the user's think time; a turn's own scheduled instant is its earliest).
    """

    request_id: int
    prompt: str
    max_tokens: int
    extra: Mapping[str, Any] = field(default_factory=dict)
    messages: tuple[Mapping[str, Any], ...] | None = None
    parent: int | None = None
    think_s: float = 0.0


Message = dict[str, Any]


def make_client(target: Target, max_connections: int, *, lean: bool = True) -> httpx.AsyncClient:
    """A client for one target whose pool holds ``max_connections`` open connections.

    Size it to the most requests that can be in flight at once, so requests never wait for a
    connection inside httpx where no timestamp can see it. ``trust_env=False`` keeps proxy
    variables from routing engine traffic through a proxy that would add its own latency. The
    client is for this target only: certificates are verified for https targets and not loaded
    at all for plain http ones. Every request asks for an uncompressed answer
    (:data:`IDENTITY_HEADERS`).
    """
    if max_connections < 1:
        raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
    https = urlsplit(target.base_url).scheme == "https"
    return httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=_KEEPALIVE_S,
        ),
        timeout=httpx.Timeout(target.timeout_s),
        headers=IDENTITY_HEADERS,
        trust_env=False,
        # Loading the CA bundle costs ~0.1 s of CPU per client; only https targets need it.
        verify=https,
        transport=None
        if https or not lean
        else LoadgenTransport(max_connections=max_connections, keepalive_expiry=_KEEPALIVE_S),
    )


GATE_SET_KEYS = frozenset(
    {"model", "prompt", "messages", "stream", "stream_options", "max_tokens"}
    | {"max_completion_tokens"}  # an engine reads it before max_tokens
)
"""Body keys the load generator sets and ``RequestSpec.extra`` never replaces: what is measured
(the model, the prompt, the stream and its usage reports, the output length) is not the
caller's to change through sampling parameters."""

IDENTITY_HEADERS: Mapping[str, str] = {"accept-encoding": "identity"}
"""Sent on every request to an engine (:func:`make_client`'s default, and explicitly by the
probes): answers are capped by their decoded bytes, so an engine must not send them
compressed, where a small body read decodes to a large one."""


def request_body(
    target: Target, req: RequestSpec, history: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The JSON body; ``history`` is the conversation so far (for a follow-up turn).
    ``req.extra`` is merged in except for :data:`GATE_SET_KEYS`."""
    body: dict[str, Any] = {"model": target.model}
    messages = conversation(req, history)
    if target.api == "chat":
        body["messages"] = messages
    elif len(messages) == 1 and messages[0].get("content") == req.prompt:
        body["prompt"] = req.prompt
    else:
        body["prompt"] = flatten(messages)
    body["max_tokens"] = req.max_tokens
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    extra = req.extra
    if not GATE_SET_KEYS.isdisjoint(extra):  # one C-level check on the hot path
        extra = {k: v for k, v in extra.items() if k not in GATE_SET_KEYS}
    body.update(extra)
    body["stream"] = True
    return body


def conversation(req: RequestSpec, history: Sequence[Mapping[str, Any]] = ()) -> list[Message]:
    """The chat messages a request stands for: its history, then its own turn."""
    if req.messages is not None:
        return [*map(dict, history), *map(dict, req.messages)]
    return [*map(dict, history), *chat_messages(req.prompt)]


def flatten(messages: Sequence[Mapping[str, Any]]) -> str:
    """Chat history as one completions prompt: the contents, one paragraph each.

    Role markup is left out on purpose: it is model-specific (the engine's chat template),
    and a completions prompt that guessed it would be wrong for most models.
    """
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return "\n\n".join(parts)


async def send_request(
    client: httpx.AsyncClient,
    target: Target,
    req: RequestSpec,
    intended_ns: int,
    *,
    history: Sequence[Mapping[str, Any]] = (),
    armed: bool = False,
) -> RequestRecord:
    """Stream one request and return its record; never raises except on cancellation.

    Every request carries ``X-Request-Id: <request_id>``, so a server's own log (the sim's
    truth log, an engine's access log) can be joined to our records.

    ``armed``: called ahead of ``intended_ns``; the request is built and a connection made
    ready now, and its bytes leave at ``intended_ns`` on the lean transport's precise timer
    (other transports: after an asyncio sleep until then). ``target.deadline_s`` counts from
    that instant.
    """
    body = request_body(target, req, history)
    state = StreamState()
    record = RequestRecord(
        request_id=req.request_id, target=target.name, intended_ns=intended_ns, sent_ns=0
    )
    headers = {
        "accept": "text/event-stream",
        "accept-encoding": "identity",
        "x-request-id": str(req.request_id),
    }
    got_headers = False
    extensions: dict[str, Any] = {}
    loop = asyncio.get_running_loop()
    leaves_at = loop.time()
    if armed:
        # httpx keeps no public handle on a client's transport; _transport is where it is.
        if isinstance(getattr(client, "_transport", None), LoadgenTransport):
            extensions[SEND_AT] = intended_ns
            leaves_at += max(0, intended_ns - time.monotonic_ns()) / 1e9
        elif (wait_ns := intended_ns - time.monotonic_ns()) > 0:
            await asyncio.sleep(wait_ns / 1e9)
            leaves_at = loop.time()
    # One timer per request, none per event: the whole exchange, however it trickles.
    deadline = asyncio.timeout_at(leaves_at + target.deadline_s)
    record.sent_ns = time.monotonic_ns()
    try:
        async with (
            deadline,
            client.stream(
                "POST",
                target.url,
                json=body,
                headers=headers,
                timeout=target.timeout_s,
                extensions=extensions,
            ) as response,
        ):
            got_headers = True
            await _read_response(response, record, state, target)
    except TimeoutError:
        if not deadline.expired():
            raise
        if not state.done:  # the deadline fell in the drain after [DONE]: still a success
            state.fail(
                "timeout",
                f"deadline on {target.url}: the request was not over after its "
                f"deadline_s of {target.deadline_s:g} s",
            )
    except SSELimitError as exc:
        # Raised out of the stream, so the response was closed unread: the connection is gone.
        state.fail("protocol_error", f"{_exc_text(exc, target)}; the connection was closed")
    except httpx.HTTPError as exc:
        state.fail(*_http_failure(exc, target, got_headers))
    if state.error_kind is not None and state.end_ns is None:
        state.end_ns = time.monotonic_ns()
    if state.error_kind is None and not state.done:
        state.fail("truncated", "stream ended without data: [DONE]")
    state.fill(record)
    return record


async def _read_response(
    response: httpx.Response, record: RequestRecord, state: StreamState, target: Target
) -> None:
    """Read one response into `state` (`send_request`): the stream, or the error it is."""
    tap = response.extensions.get("loadgen.tap")
    if isinstance(tap, StreamTap):
        # The instant the bytes reached the socket, not before httpx built the request.
        record.sent_ns = tap.sent_ns
    else:
        tap = None
    record.resent = bool(response.extensions.get("loadgen.resent"))
    record.status = response.status_code
    content_type = response.headers.get("content-type", "")
    if response.status_code >= 300:
        await _read_error(response, state, _status_kind(response.status_code))
    elif content_type.startswith("application/json"):
        await _read_error(response, state, "protocol_error", "not an event stream")
    else:
        await _consume(response, state, tap, target.timeout_s)


def _http_failure(exc: httpx.HTTPError, target: Target, got_headers: bool) -> tuple[ErrorKind, str]:
    """The error kind and message of a request httpx failed (`send_request`)."""
    if isinstance(exc, httpx.PoolTimeout):
        # Client-side queueing, not the engine: say so, since the kind alone cannot.
        why = f"no free connection in the client pool for {target.timeout_s:g} s"
        return "timeout", f"{_exc_text(exc, target)} ({why}; pool too small for the load)"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", f"{_exc_text(exc, target)} (no progress for {target.timeout_s:g} s)"
    if isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError):
        return ("truncated" if got_headers else "connect"), _exc_text(exc, target)
    if isinstance(exc, httpx.DecodingError):
        return "protocol_error", _exc_text(exc, target)
    return "connect", _exc_text(exc, target)


async def _read_error(
    response: httpx.Response, state: StreamState, kind: ErrorKind, why: str = ""
) -> None:
    """Classify by status first, so a body that fails to arrive cannot hide a 5xx.

    At most :data:`MAX_ERROR_BODY_BYTES` of the body are read; a longer one is cut there (its
    JSON then fails to parse, and the message quotes the start of its text)."""
    try:
        payload, more = await read_capped(response, MAX_ERROR_BODY_BYTES)
    except httpx.HTTPError:
        payload, more = b"", False
    state.end_ns = time.monotonic_ns()
    message = _error_text(payload, response)
    if more:
        cut = f"error body over MAX_ERROR_BODY_BYTES ({MAX_ERROR_BODY_BYTES} bytes), cut"
        why = f"{why}; {cut}" if why else cut
    state.fail(kind, f"{message} ({why})" if why else message)


async def read_capped(response: httpx.Response, cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of a streamed response's body, and whether it held more.

    Reading stops at the cap: the rest is never read, and closing the response then drops
    the connection instead of handing it back to the pool. Bodies are decoded (a compressed
    body counts by its decoded bytes, which is what memory holds).
    """
    parts: list[bytes] = []
    size = 0
    async for piece in response.aiter_bytes():
        size += len(piece)
        if size > cap:
            parts.append(piece[: len(piece) - (size - cap)])
            return b"".join(parts), True
        parts.append(piece)
    return b"".join(parts), False


async def _consume(
    response: httpx.Response, state: StreamState, tap: StreamTap | None, timeout_s: float
) -> None:
    parser = SSEParser()
    if tap is not None and _identity(response):
        feed = parser.feed
        handle = state.handle

        def sink(chunk: bytes, now: int) -> bool:
            for event in feed(chunk):  # noqa: SIM110 - no generator per read on the hot path
                if not handle(event, now):
                    return False
            return True

        await tap.consume(sink, read_timeout=timeout_s, drain_s=_DRAIN_S)
        if state.done or state.error_kind is not None:
            return None
    else:
        stream = response.aiter_raw() if _identity(response) else response.aiter_bytes()
        async for chunk in stream:
            now = time.monotonic_ns()
            for event in parser.feed(chunk):
                if not state.handle(event, now):
                    return await _drain(stream, state)
    now = time.monotonic_ns()
    for event in parser.close():
        if not state.handle(event, now):
            return None
    return None


def _identity(response: httpx.Response) -> bool:
    """Raw bytes skip httpx's decoder; only a server that ignored our identity request needs
    it."""
    encoding: str = response.headers.get("content-encoding", "identity")
    return encoding.lower() == "identity"


async def _drain(stream: AsyncIterator[bytes], state: StreamState) -> None:
    """Read the rest of the body after [DONE], so the connection can be reused.

    Leaving a response unread makes httpcore drop the connection, and the next request on this
    target would then pay a new TCP handshake inside its TTFT. The wait is bounded so a server
    that keeps a finished stream open cannot hold up the run; anything read is ignored.
    """
    if not state.done:
        return
    try:
        async with asyncio.timeout(_DRAIN_S):
            async for _ in stream:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass


def _status_kind(status: int) -> ErrorKind:
    if status >= 500:
        return "http_5xx"
    if status >= 400:
        return "http_4xx"
    return "protocol_error"  # a redirect or other non-2xx we do not follow


def _error_text(payload: bytes, response: httpx.Response) -> str:
    text = payload.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    message = error_message(obj) if isinstance(obj, dict) else None
    prefix = f"HTTP {response.status_code}"
    return f"{prefix}: {excerpt(message if message is not None else text.strip())}"


def _exc_text(exc: Exception, target: Target) -> str:
    detail = str(exc)
    return f"{type(exc).__name__} on {target.url}" + (f": {detail}" if detail else "")
