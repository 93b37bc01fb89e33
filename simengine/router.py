"""The router of a disaggregated sim: one OpenAI-compatible front for two worker groups.

``python -m simengine.router --port P --prefill URL [--prefill URL ...] --decode URL
[--decode URL ...]`` stands where vLLM's proxy, SGLang's router or llm-d's gateway stands in
front of prefill and decode workers (sims started with ``--role prefill`` and ``--role
decode``), so a gate can run a two-group engine end to end without a GPU.

A generation request goes as in vLLM's proxy for its KV connectors
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``), the simplest faithful
split: first to a prefill worker (round robin) as the same request with ``max_tokens: 1``, no
stream, no ``stream_options`` nor ``min_tokens`` and ``kv_transfer_params:
{do_remote_decode: true}``; its JSON answer carries the KV hand-off in
``kv_transfer_params``, which goes with the client's own request to a decode worker (round
robin), whose answer, stream or not, is the client's, byte for byte. The prefill worker's one
token is dropped: the decode worker computes every token, so text, logprobs and usage are a
whole sim's. The sim also drops ``prompt_logprobs`` from the prefill request (the decode
worker scores the prompt; a prefill's scores would be thrown away).

What a client sees when it goes wrong, always within bounded time (``--connect-timeout``,
``--timeout``, the longest silence of a worker):

- a worker's own answer that is not 200 (a 400, a 404, its 429 or 503, its 500) goes to the
  client unchanged, with ``x-sim-worker: <group> <url>``: a whole sim would have answered it;
- a worker that cannot be reached or breaks off before answering: 502, a timeout: 504, with
  ``{"error": {message, type, param, code}}`` naming the group and the worker;
- a decode stream that breaks off once tokens went out: the client's connection is cut, as
  when a whole engine crashes mid-stream. The response head waits for the stream's first
  bytes, so a decode worker that dies on a request still gives a clean 502.

``/health`` is 200 only while every worker's is (a serving unit is not ready until both
groups are); otherwise 503 with a body naming the workers that are not. ``/v1/models``,
``/version``, ``/tokenize`` and ``/detokenize`` are a decode worker's; ``/metrics`` is the
router's own (``sim:router_*`` per group).

Why these HTTP pieces: the front is the sim's own server (``http11.py``), which listens
within a fraction of a second and writes stream bytes straight to the transport; the calls to
workers use httpx, which the project already depends on and which gives connection pools,
chunked decoding and per-phase timeouts without a second hand-written client. The router is
not on the path ``bench/sim_bench.py`` measures. It imports neither numpy nor the toy model.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import signal
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from simengine.announce import base_url, format_listening_line
from simengine.http11 import HttpProtocol, Request, Responder, cut_connections, start_server
from simengine.server import bind_socket

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
# Answered by a decode worker: it has the model card, the tokenizer and the version.
DECODE_GETS = ("/v1/models", "/version")
DECODE_POSTS = ("/tokenize", "/detokenize")
_TYPES = {404: "NotFoundError", 405: "MethodNotAllowedError", 502: "BadGatewayError"}
_TYPES |= {503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}


def log(message: str) -> None:
    print(f"sim router: {message}", file=sys.stderr, flush=True)


def error_body(status: int, message: str) -> bytes:
    """The sim's (vLLM's) error shape, without importing the sim's protocol module."""
    error = {"message": message, "type": _TYPES.get(status, "APIError"), "param": None}
    return json.dumps({"error": {**error, "code": status}}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class RouterConfig:
    port: int
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    host: str = "127.0.0.1"
    connect_timeout_s: float = 5.0
    timeout_s: float = 60.0
    health_timeout_s: float = 2.0


class UpstreamError(Exception):
    """No answer from a worker: unreachable, broke off, or silent for too long."""

    def __init__(self, status: int, message: str, worker: Worker) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.worker = worker


class Worker:
    """One prefill or decode worker: its client and whether it is failing (for the log)."""

    def __init__(self, group: str, url: str, config: RouterConfig) -> None:
        self.group = group
        self.url = url
        self.label = f"{group} {url}"
        timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        self.client = httpx.AsyncClient(
            base_url=url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            trust_env=False,
            headers={"accept-encoding": "identity"},
        )
        self.failing = False

    def failed(self, exc: httpx.HTTPError, timeout_s: float) -> UpstreamError:
        """The error the client gets; logged once until the worker answers again."""
        if isinstance(exc, httpx.TimeoutException):
            status, what = 504, f"did not answer within {timeout_s:g} s"
        elif isinstance(exc, httpx.ConnectError):
            status, what = 502, "is unreachable"
        else:
            status, what = 502, "broke off"
        message = f"the {self.group} worker {self.url} {what} ({type(exc).__name__})"
        if not self.failing:
            self.failing = True
            log(message)
        return UpstreamError(status, message, self)

    def answered(self) -> None:
        if self.failing:
            self.failing = False
            log(f"the {self.label} worker answers again")


Route = Callable[[Request, Responder], Awaitable[None]]


def prefill_body(data: dict[str, Any]) -> bytes:
    """The prefill half of a request, as vLLM's toy proxy builds it (module docstring)."""
    body = dict(data)
    body["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for name in ("stream_options", "min_tokens", "min_completion_tokens", "prompt_logprobs"):
        body.pop(name, None)
    return json.dumps(body, separators=(",", ":")).encode()


class Router:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.prefill = [Worker("prefill", url, config) for url in config.prefill]
        self.decode = [Worker("decode", url, config) for url in config.decode]
        self._next_prefill = itertools.cycle(self.prefill)
        self._next_decode = itertools.cycle(self.decode)
        self._ids = itertools.count(1)
        self.sent: Counter[str] = Counter()  # requests sent, by group
        self.failures: Counter[str] = Counter()  # no answer (UpstreamError), by group
        self.error_answers: Counter[str] = Counter()  # a worker's own non-200, by group
        self._routes: dict[str, dict[str, Route]] = {
            "/health": {"GET": self._health},
            "/metrics": {"GET": self._metrics},
        }
        for path in DECODE_GETS:
            self._routes[path] = {"GET": self._to_decode}
        for path in DECODE_POSTS:
            self._routes[path] = {"POST": self._to_decode}
        for path in GENERATION_PATHS:
            self._routes[path] = {"POST": self._generate}

    async def close(self) -> None:
        await asyncio.gather(*(w.client.aclose() for w in [*self.prefill, *self.decode]))

    async def handle(self, request: Request, responder: Responder) -> None:
        methods = self._routes.get(request.path)
        if methods is None:
            responder.send(404, error_body(404, f"Not Found: {request.path}"))
            return
        route = methods.get(request.method)
        if route is None and request.method == "HEAD":
            route = methods.get("GET")
        if route is None:
            body = error_body(405, f"Method {request.method} not allowed")
            responder.send(405, body, headers=[("allow", ", ".join(sorted(methods)))])
            return
        try:
            await route(request, responder)
        except UpstreamError as exc:
            self.failures[exc.worker.group] += 1
            if responder.started:
                responder.abort()  # tokens went out: cut it, as a crashed engine does
                return
            headers = [("x-sim-worker", exc.worker.label)]
            responder.send(exc.status, error_body(exc.status, exc.message), headers=headers)

    # -- readiness and the router's own counters ---------------------------------------------

    async def _worker_health(self, worker: Worker) -> str | None:
        """None when the worker's /health is 200, else what it is."""
        try:
            resp = await worker.client.get("/health", timeout=self.config.health_timeout_s)
        except httpx.HTTPError as exc:
            return f"{worker.label}: {type(exc).__name__}"
        return None if resp.status_code == 200 else f"{worker.label}: /health {resp.status_code}"

    async def _health(self, request: Request, responder: Responder) -> None:
        workers = [*self.prefill, *self.decode]
        problems = [p for p in await asyncio.gather(*map(self._worker_health, workers)) if p]
        if not problems:
            responder.send(200, b"", content_type=None)
            return
        responder.send(503, error_body(503, "workers not ready: " + "; ".join(problems)))

    async def _metrics(self, request: Request, responder: Responder) -> None:
        lines: list[str] = []
        for name, counts, help_text in (
            ("sim:router_requests_total", self.sent, "Requests sent to workers."),
            ("sim:router_failures_total", self.failures, "Requests a worker never answered."),
            ("sim:router_error_answers_total", self.error_answers, "Workers' non-200 answers."),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            lines += [f'{name}{{group="{g}"}} {float(counts[g])}' for g in ("prefill", "decode")]
        body = ("\n".join(lines) + "\n").encode()
        responder.send(200, body, content_type="text/plain; version=0.0.4; charset=utf-8")

    # -- forwarding ----------------------------------------------------------------------------

    async def _call(
        self, worker: Worker, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> httpx.Response:
        self.sent[worker.group] += 1
        try:
            resp = await worker.client.request(method, path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise worker.failed(exc, self.config.timeout_s) from None
        worker.answered()
        return resp

    def _relay(self, worker: Worker, resp: httpx.Response, responder: Responder) -> None:
        """A worker's whole answer, as it gave it."""
        xrid = resp.headers.get("x-request-id")
        headers = [("x-request-id", xrid)] if xrid else []
        if resp.status_code != 200:
            self.error_answers[worker.group] += 1
            headers.append(("x-sim-worker", worker.label))
        content_type = resp.headers.get("content-type")
        responder.send(resp.status_code, resp.content, content_type=content_type, headers=headers)

    async def _to_decode(self, request: Request, responder: Responder) -> None:
        worker = next(self._next_decode)
        headers = {k: v for k, v in request.headers.items() if k == "content-type"}
        resp = await self._call(worker, request.method, request.target, request.body, headers)
        self._relay(worker, resp, responder)

    async def _generate(self, request: Request, responder: Responder) -> None:
        xrid = request.headers.get("x-request-id")
        headers = {"content-type": "application/json"}
        if xrid:
            headers["x-request-id"] = xrid
        try:
            data = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            data = None
        if not isinstance(data, dict):
            # Nothing to split: the decode worker answers the sim's 400 for it.
            await self._decode(request, request.body, headers, responder, stream=False)
            return
        data.pop("kv_transfer_params", None)  # the router's to set, never the client's
        prefill = next(self._next_prefill)
        prefill_headers = {**headers, "x-request-id": xrid or f"pd-{next(self._ids)}"}
        resp = await self._call(prefill, "POST", request.path, prefill_body(data), prefill_headers)
        if resp.status_code != 200:
            self._relay(prefill, resp, responder)  # a whole sim would have refused it too
            return
        try:
            handoff = resp.json().get("kv_transfer_params")
        except (ValueError, AttributeError):
            handoff = None
        if isinstance(handoff, dict):
            data["kv_transfer_params"] = handoff
        # else (a prefill worker that is no such thing): the decode worker prefills itself,
        # as vLLM's proxy lets it.
        body = json.dumps(data, separators=(",", ":")).encode()
        await self._decode(request, body, headers, responder, stream=data.get("stream") is True)

    async def _decode(
        self,
        request: Request,
        body: bytes,
        headers: dict[str, str],
        responder: Responder,
        *,
        stream: bool,
    ) -> None:
        worker = next(self._next_decode)
        if not stream:
            self._relay(
                worker, await self._call(worker, "POST", request.path, body, headers), responder
            )
            return
        self.sent[worker.group] += 1
        try:
            async with worker.client.stream(
                "POST", request.path, content=body, headers=headers
            ) as resp:
                content_type = resp.headers.get("content-type", "")
                if resp.status_code != 200 or not content_type.startswith("text/event-stream"):
                    await resp.aread()
                    worker.answered()
                    self._relay(worker, resp, responder)
                    return
                xrid = resp.headers.get("x-request-id")
                echo = [("x-request-id", xrid)] if xrid else []
                async for piece in resp.aiter_raw():
                    if not responder.started:
                        responder.start_stream(content_type=content_type, headers=echo)
                    responder.write(piece)
                    await responder.drain()
                if not responder.started:
                    responder.start_stream(content_type=content_type, headers=echo)
                worker.answered()
        except httpx.HTTPError as exc:
            raise worker.failed(exc, self.config.timeout_s) from None


# -- command line and process ------------------------------------------------------------------


def _worker_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise argparse.ArgumentTypeError(f"not an http://HOST:PORT URL: {text!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"a worker URL has no path: {text!r}")
    return text.rstrip("/")


def _seconds(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simengine.router",
        description=(
            "OpenAI-compatible front of a disaggregated sim: each generation request is "
            "prefilled by a --prefill worker (sim --role prefill) and decoded by a --decode "
            "worker (sim --role decode), whose answer the client gets unchanged."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, required=True, help="port to bind; 0 picks one, announced on stdout"
    )
    for role in ("prefill", "decode"):
        parser.add_argument(
            f"--{role}",
            type=_worker_url,
            action="append",
            required=True,
            metavar="URL",
            help=f"a {role} worker, http://HOST:PORT (repeatable; round robin)",
        )
    parser.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="longest wait for a worker's connection (default 5)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=60.0,
        metavar="S",
        help="longest silence of a worker before the request fails with 504 (default 60)",
    )
    parser.add_argument(
        "--health-timeout",
        type=_seconds,
        default=2.0,
        metavar="S",
        help="longest wait for a worker's /health when the router's is asked (default 2)",
    )
    parser.add_argument("--tag", default="", help="free text, ignored (find the process by it)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> RouterConfig:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not 0 <= ns.port <= 65535:
        parser.error("--port must be in [0, 65535]")
    return RouterConfig(
        port=ns.port,
        prefill=tuple(ns.prefill),
        decode=tuple(ns.decode),
        host=ns.host,
        connect_timeout_s=ns.connect_timeout,
        timeout_s=ns.timeout,
        health_timeout_s=ns.health_timeout,
    )


async def serve(config: RouterConfig) -> int:
    """Run the router until SIGTERM or SIGINT; the return value is the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as exc:
        log(f"cannot listen on {config.host}:{config.port}: {exc}")
        return 1
    router = Router(config)
    connections: set[HttpProtocol] = set()
    server = await start_server(router.handle, sock, connections)
    port = int(sock.getsockname()[1])
    print(format_listening_line(config.host, port), flush=True)
    log(
        f"on {base_url(config.host, port)}: prefill {', '.join(config.prefill)}; "
        f"decode {', '.join(config.decode)}"
    )
    await stop.wait()
    log("shutting down")
    await cut_connections(server, connections)
    await router.close()
    await server.wait_closed()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
