"""The sim's HTTP application: routes, handlers and the faults a client can observe.

Faults (``--error-rate``, ``--crash-after-requests``) live here, at the HTTP edge, because that
is where a real engine's failures become visible to clients.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable

from gate.engines.sim.config import SimConfig
from gate.engines.sim.engine import SimEngine, StreamEvent
from gate.engines.sim.http11 import Request, Responder
from gate.engines.sim.model import ToyModel, ToyTokenizer
from gate.engines.sim.protocol import (
    DONE_EVENT,
    ApiError,
    ApiRequest,
    StreamEncoder,
    dumps,
    full_response,
    new_request_id,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)
from gate.engines.sim.timing import TimingModel

Route = Callable[[Request, Responder], Awaitable[None]]
Parser = Callable[[bytes, ToyTokenizer, str, int], ApiRequest]

FINISH_REASONS = ("stop", "length", "abort")
SIM_VERSION = "0.1.0-sim"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class SimApp:
    """Routes and handlers; state shared across requests lives on the engine."""

    def __init__(self, config: SimConfig, tokenizer: ToyTokenizer, model: ToyModel) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.engine = SimEngine(
            model,
            tokenizer,
            TimingModel(config),
            tokens_per_event=config.tokens_per_event,
            max_num_seqs=config.max_num_seqs,
            seed=config.seed,
        )
        self.ready = False
        self.started_generations = 0
        self.injected_errors = 0
        self._fault_rng = random.Random(f"faults-{config.seed}")
        self._created = int(time.time())
        self._routes: dict[str, dict[str, Route]] = {
            "/health": {"GET": self._health},
            "/metrics": {"GET": self._metrics},
            "/version": {"GET": self._version},
            "/v1/models": {"GET": self._models},
            "/v1/completions": {"POST": self._completions},
            "/v1/chat/completions": {"POST": self._chat},
            "/tokenize": {"POST": self._tokenize},
            "/detokenize": {"POST": self._detokenize},
        }
        # Endpoints that answer before the engine is warm; the rest answer 503 until then.
        self._always_open = {"/health", "/metrics", "/version"}

    async def handle(self, request: Request, responder: Responder) -> None:
        try:
            methods = self._routes.get(request.path)
            if methods is None:
                raise ApiError(404, f"Not Found: {request.path}")
            route = methods.get(request.method)
            if route is None and request.method == "HEAD":
                route = methods.get("GET")
            if route is None:
                allowed = ", ".join(sorted(methods))
                responder.send(
                    405,
                    ApiError(405, f"Method {request.method} not allowed").body(),
                    headers=[("allow", allowed)],
                )
                return
            if not self.ready and request.path not in self._always_open:
                raise ApiError(503, "The server is warming up")
            await route(request, responder)
        except ApiError as exc:
            if responder.started:
                raise
            responder.send(exc.status, exc.body())

    # -- simple endpoints ------------------------------------------------------------------

    async def _health(self, request: Request, responder: Responder) -> None:
        responder.send(200 if self.ready else 503, b"", content_type=None)

    async def _version(self, request: Request, responder: Responder) -> None:
        responder.send(200, dumps({"version": SIM_VERSION}).encode())

    async def _models(self, request: Request, responder: Responder) -> None:
        cfg = self.config
        card = {
            "id": cfg.model,
            "object": "model",
            "created": self._created,
            "owned_by": "sim",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        responder.send(200, dumps({"object": "list", "data": [card]}).encode())

    async def _tokenize(self, request: Request, responder: Responder) -> None:
        tokens = parse_tokenize_request(request.body, self.tokenizer, self.config.model)
        body = {"count": len(tokens), "max_model_len": self.config.max_model_len, "tokens": tokens}
        responder.send(200, dumps(body).encode())

    async def _detokenize(self, request: Request, responder: Responder) -> None:
        text = parse_detokenize_request(request.body, self.tokenizer, self.config.model)
        responder.send(200, dumps({"prompt": text}).encode())

    async def _metrics(self, request: Request, responder: Responder) -> None:
        stats = self.engine.stats
        labels = f'model_name="{_label(self.config.model)}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(stats.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(stats.waiting)}",
            "# HELP vllm:request_success_total Count of finished requests by finish reason.",
            "# TYPE vllm:request_success_total counter",
        ]
        lines.extend(
            f'vllm:request_success_total{{finished_reason="{reason}",{labels}}} '
            f"{float(stats.finished[reason])}"
            for reason in FINISH_REASONS
        )
        lines += [
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{labels}}} {float(stats.prompt_tokens)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {float(stats.generation_tokens)}",
            "# HELP sim:generation_requests_total Generation requests accepted by the sim.",
            "# TYPE sim:generation_requests_total counter",
            f"sim:generation_requests_total{{{labels}}} {float(self.started_generations)}",
            "# HELP sim:injected_errors_total Requests failed on purpose by --error-rate.",
            "# TYPE sim:injected_errors_total counter",
            f"sim:injected_errors_total{{{labels}}} {float(self.injected_errors)}",
        ]
        body = ("\n".join(lines) + "\n").encode()
        responder.send(200, body, content_type="text/plain; version=0.0.4; charset=utf-8")

    # -- generation ------------------------------------------------------------------------

    async def _completions(self, request: Request, responder: Responder) -> None:
        await self._generate(request, responder, parse_completion_request)

    async def _chat(self, request: Request, responder: Responder) -> None:
        await self._generate(request, responder, parse_chat_request)

    def _inject_error(self) -> None:
        rate = self.config.error_rate
        if rate > 0.0 and self._fault_rng.random() < rate:
            self.injected_errors += 1
            raise ApiError(500, "Simulated engine failure (--error-rate)")

    def _count_generation_start(self) -> None:
        self.started_generations += 1
        limit = self.config.crash_after_requests
        if limit is not None and self.started_generations > limit:
            print(
                f"sim: crashing at request {self.started_generations} (--crash-after-requests)",
                file=sys.stderr,
                flush=True,
            )
            # No cleanup on purpose: in-flight streams must break the way a dead engine's do.
            os._exit(1)

    async def _generate(self, request: Request, responder: Responder, parse: Parser) -> None:
        cfg = self.config
        api = parse(request.body, self.tokenizer, cfg.model, cfg.max_model_len)
        self._inject_error()
        request_id = new_request_id(api.endpoint)
        events = self.engine.generate(api.generation)
        if not api.stream:
            self._count_generation_start()
            collected: list[StreamEvent] = []
            async with contextlib.aclosing(events):
                async for event in events:
                    collected.append(event)
            body = full_response(
                api, collected, request_id=request_id, model=cfg.model, tokenizer=self.tokenizer
            )
            responder.send(200, body)
            return

        # Headers go out at once, as with vLLM; the body waits for the first token.
        responder.start_stream()
        self._count_generation_start()
        encoder = StreamEncoder(
            api, request_id=request_id, model=cfg.model, tokenizer=self.tokenizer
        )
        needs_role = api.endpoint == "chat"
        completion_tokens = 0
        async with contextlib.aclosing(events):
            async for event in events:
                if needs_role:
                    responder.write(encoder.role_event())
                    needs_role = False
                responder.write(encoder.event(event))
                completion_tokens = event.completion_tokens
                await responder.drain()
        if api.stream_options.include_usage:
            responder.write(encoder.usage_event(completion_tokens))
        responder.write(DONE_EVENT)
        responder.end_stream()
