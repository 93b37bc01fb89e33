"""The sim's HTTP application: routes, handlers and the faults a client can observe.

Faults live here, at the HTTP edge, because that is where a real engine's failures become
visible to clients: an HTTP 500 or 429 before the stream, a crash that cuts every stream, an
error event or a silent stall inside a stream, NaN logprobs. The engine underneath only
schedules and decodes; a stream's ``Output`` decides, event by event, what actually goes out.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from simengine import metrics
from simengine.config import SimConfig
from simengine.engine import EngineSeq, GenerationRequest, Output, SimEngine, StreamEvent
from simengine.faults import FaultCounters, FaultPlan, StreamFaults
from simengine.http11 import ConnectionStats, Request, Responder
from simengine.model import PromptTokenLogprobs, ToyModel, ToyTokenizer
from simengine.protocol import (
    ApiError,
    ApiRequest,
    Endpoint,
    bad_request,
    dumps,
    kv_transfer_params,
    parse_detokenize_request,
    parse_generation_request,
    parse_tokenize_request,
)
from simengine.responses import (
    DONE_EVENT,
    StreamEncoder,
    full_response,
    new_request_id,
    stream_error_event,
)
from simengine.timing import StepTimer
from simengine.truth import TruthLog, TruthRecord

Route = Callable[[Request, Responder], Awaitable[None]]
# A request's part in a disaggregated engine: this prefill worker hands its KV on ("send"),
# this decode worker takes a prefill's KV ("receive"), or None: served as a whole engine.
KvPart = Literal["send", "receive"] | None

SIM_VERSION = "0.2.0-sim"
# Prompt positions scored between yields to the event loop: scoring costs ~80 us a position,
# and a long prompt scored in one go would stall every stream of the process.
_SCORE_CHUNK = 24


class StreamOutput:
    """One SSE response: renders events, applies the stream's faults, records ground truth.

    Called from the engine loop, never awaited: each event is one ``write`` to the transport,
    and a hang or an error event simply takes the request out of the batch.
    """

    def __init__(
        self,
        responder: Responder,
        encoder: StreamEncoder,
        record: TruthRecord,
        faults: StreamFaults,
        counters: FaultCounters,
        *,
        chat: bool,
        include_usage: bool,
        done: asyncio.Future[None],
    ) -> None:
        self._responder = responder
        self._encoder = encoder
        self._record = record
        self._hang_after = faults.hang_after
        self._error_after = faults.error_after
        self._counters = counters
        self._role_pending = chat
        self._include_usage = include_usage
        self.done = done
        self.tokens = 0
        self.hung = False
        self.stream_error = False

    @property
    def complete(self) -> bool:
        return self.done.done()

    def prepare(self, event: StreamEvent) -> bytes:
        encoder = self._encoder
        data = b""
        if self._role_pending:
            # vLLM sends the role-only chunk right before the first content chunk.
            self._role_pending = False
            data = encoder.role_event()
        data += encoder.event(event)
        if event.finish_reason is not None:
            if self._include_usage:
                data += encoder.usage_event(event.completion_tokens)
            data += DONE_EVENT
        return data

    def deliver(self, event: StreamEvent, data: bytes, scheduled_ns: int) -> bool:
        if self.done.done() or self.hung:
            return False
        if self._hang_after is not None and self.tokens >= self._hang_after:
            # Silence, connection kept open: the handler waits until the client gives up.
            self.hung = True
            self._counters.hung_streams += 1
            self._record.ended("hang", time.monotonic_ns())
            return False
        if self._error_after is not None and (
            self.tokens >= self._error_after or event.finish_reason is not None
        ):
            self.stream_error = True
            self._counters.stream_errors += 1
            self._responder.write(
                stream_error_event("Simulated engine failure (--stream-error-rate)") + DONE_EVENT
            )
            self._record.ended("error", time.monotonic_ns())
            self.done.set_result(None)
            return False
        self._responder.write(data)
        now = time.monotonic_ns()
        self._record.add_event(now, len(event.token_ids), scheduled_ns)
        self.tokens += len(event.token_ids)
        if event.finish_reason is not None:
            self._record.ended("done", now)
            self.done.set_result(None)
        return True


class CollectOutput:
    """A non-streaming response: the events are merged into one body at the end."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.events: list[StreamEvent] = []
        self.done = done

    @property
    def complete(self) -> bool:
        return self.done.done()

    def prepare(self, event: StreamEvent) -> bytes:
        return b""

    def deliver(self, event: StreamEvent, data: bytes, scheduled_ns: int) -> bool:
        self.events.append(event)
        if event.finish_reason is not None and not self.done.done():
            self.done.set_result(None)
        return True


class SimApp:
    """Routes and handlers; state shared across requests lives on the engine."""

    def __init__(
        self,
        config: SimConfig,
        tokenizer: ToyTokenizer,
        model: ToyModel,
        *,
        truth: TruthLog | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.model = model
        self.timer = StepTimer(config.cost_model(), config.seed, origin_ns=time.monotonic_ns())
        self.engine = SimEngine(
            model,
            tokenizer,
            self.timer,
            tokens_per_event=config.tokens_per_event,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            kv_cache_tokens=config.kv_cache_tokens,
            seed=config.seed,
            stalls=config.stalls,
        )
        self.truth = truth
        self.faults = FaultPlan(config)
        self.served = config.served()  # --max-logprobs, --without
        self.ready = False
        self.started_generations = 0
        self.injected_errors = 0
        self.shed_requests = 0
        self.slow_requests = 0  # --slow-share: requests whose TTFT is --slow-factor times
        self.kv_handoffs = 0  # --role prefill: KV handed on to a decode worker
        self.kv_transfers = 0  # --role decode: requests whose prompt KV came from a prefill
        self.address = (config.host, config.port)  # where it listens, once bound (server.py)
        self._engine_id = f"sim-{config.role}-{os.getpid()}"
        self.stream_faults = FaultCounters()
        self.connections = ConnectionStats()  # the server's habits at work (http11.py)
        self._in_frontend = 0
        self._ids = itertools.count(1)
        self._frontend_s = self.timer.frontend_ns() / 1e9
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

    def mark_ready(self) -> None:
        """Serving starts now: degradation and --crash-after-s count from here."""
        self.ready = True
        self.timer.origin_ns = time.monotonic_ns()

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
        tokens = parse_tokenize_request(
            request.body, self.tokenizer, self.config.model, self.served
        )
        body = {"count": len(tokens), "max_model_len": self.config.max_model_len, "tokens": tokens}
        responder.send(200, dumps(body).encode())

    async def _detokenize(self, request: Request, responder: Responder) -> None:
        text = parse_detokenize_request(request.body, self.tokenizer, self.config.model)
        responder.send(200, dumps({"prompt": text}).encode())

    async def _metrics(self, request: Request, responder: Responder) -> None:
        responder.send(200, metrics.render(self), content_type=metrics.CONTENT_TYPE)

    # -- generation ------------------------------------------------------------------------

    async def _completions(self, request: Request, responder: Responder) -> None:
        await self._generate(request, responder, "completion")

    async def _chat(self, request: Request, responder: Responder) -> None:
        await self._generate(request, responder, "chat")

    def _inject_error(self) -> None:
        if self.faults.http_error():
            self.injected_errors += 1
            raise ApiError(500, "Simulated engine failure (--error-rate)")

    def _shed_if_overloaded(self) -> None:
        limit = self.config.max_waiting
        if limit is None:
            return
        engine = self.engine
        # Requests that will wait for a sequence slot, not those the next step admits anyway.
        queued = engine.waiting + self._in_frontend - max(0, engine.scheduler.free_slots())
        if queued >= limit:
            self.shed_requests += 1
            status = self.config.shed_status
            raise ApiError(
                status,
                f"The server is overloaded: {queued} requests are waiting "
                f"(--max-waiting {limit}). Please retry later.",
            )

    def _count_generation_start(self) -> int:
        self.started_generations += 1
        limit = self.config.crash_after_requests
        if limit is not None and self.started_generations > limit:
            self.crash(f"crashing at request {self.started_generations} (--crash-after-requests)")
        return self.started_generations

    def crash(self, reason: str) -> None:
        """Die the way a dead engine does: no cleanup, so in-flight streams just break."""
        print(f"sim: {reason}", file=sys.stderr, flush=True)
        if self.truth is not None:
            self.truth.flush()  # the ground truth survives; clients still see a crash
        os._exit(1)

    def _nan(self, number: int) -> bool:
        limit = self.config.nan_after_requests
        return limit is not None and number > limit

    def _kv_part(self, body: bytes, api: ApiRequest) -> KvPart:
        """What this worker of a disaggregated engine does with the request's KV, from its
        ``kv_transfer_params`` as vLLM's KV connectors read them: a prefill worker honours
        ``do_remote_decode``, a decode worker ``do_remote_prefill``, anything else is served
        whole (as a vLLM worker with ``kv_role: kv_both`` serves a request sent without)."""
        params = kv_transfer_params(body)
        if params is None:
            return None
        if self.config.role == "prefill" and params.get("do_remote_decode") is True:
            if api.stream:
                # The hand-off travels in the JSON answer, as vLLM's does; a stream has none.
                raise bad_request(
                    "`kv_transfer_params` with `do_remote_decode` needs `stream: false`",
                    "kv_transfer_params",
                )
            return "send"
        if self.config.role == "decode" and params.get("do_remote_prefill") is True:
            held = params.get("num_prompt_tokens")
            prompt = len(api.generation.prompt_token_ids)
            if held is not None and held != prompt:
                # A router that sent the decode another prompt than it prefilled.
                raise bad_request(
                    f"`kv_transfer_params` holds the KV of {held} prompt tokens, "
                    f"but the prompt has {prompt}",
                    "kv_transfer_params",
                )
            return "receive"
        return None

    def _handoff(self, api: ApiRequest, request_id: str, arrival_ns: int) -> dict[str, Any]:
        """A prefill's answer to the router: where the KV is and how long the prefill took."""
        self.kv_handoffs += 1
        host, port = self.address
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self._engine_id,
            "remote_request_id": request_id,
            "remote_host": host,
            "remote_port": port,
            "num_prompt_tokens": len(api.generation.prompt_token_ids),
            "first_token_ms": round((time.monotonic_ns() - arrival_ns) / 1e6, 3),
        }

    async def _submit(
        self,
        generation: GenerationRequest,
        output: Output,
        arrival_ns: int,
        turn_ns: int,
        remote: bool,
        ttft_factor: float,
    ) -> EngineSeq:
        self.engine.took_in(time.monotonic_ns() - turn_ns)
        wait_s = self._frontend_s
        if remote:
            # The prompt's KV comes over the network first; the request then joins the batch.
            self.kv_transfers += 1
            wait_s += self.timer.kv_transfer_ns(len(generation.prompt_token_ids)) / 1e9
        if wait_s > 0.0:
            self._in_frontend += 1
            try:
                await asyncio.sleep(wait_s)
            finally:
                self._in_frontend -= 1
        return self.engine.submit(
            generation,
            output,
            arrival_ns=arrival_ns,
            remote_prefill=remote,
            ttft_factor=ttft_factor,
        )

    async def _generate(self, request: Request, responder: Responder, endpoint: Endpoint) -> None:
        request_id = request.headers.get("x-request-id") or f"sim-{next(self._ids)}"
        record = TruthRecord(request_id, request.path, request.arrival_ns, request.read_ns)
        try:
            await self._serve_generation(request, responder, endpoint, record)
        except ApiError as exc:
            record.status = exc.status
            record.ended("done", time.monotonic_ns())  # a whole (error) response
            raise
        finally:
            if self.truth is not None:
                self.truth.record(record)

    async def _serve_generation(
        self, request: Request, responder: Responder, endpoint: Endpoint, record: TruthRecord
    ) -> None:
        cfg = self.config
        turn = await self.engine.intake_turn()  # parse and tokenize between steps
        try:
            api = parse_generation_request(
                endpoint, request.body, self.tokenizer, cfg.model, cfg.max_model_len, self.served
            )
            part = None if cfg.role == "both" else self._kv_part(request.body, api)
            self._inject_error()
            self._shed_if_overloaded()
        except BaseException:
            self.engine.took_in(time.monotonic_ns() - turn)  # refused: the turn ends here
            raise
        xrid = request.headers.get("x-request-id")
        response_id = new_request_id(api.endpoint, xrid)
        headers = [("x-request-id", xrid)] if xrid else []
        loop = asyncio.get_running_loop()
        if not api.stream:
            number = self._count_generation_start()
            collected = CollectOutput(loop.create_future())
            remote = part == "receive"
            await self._run(api.generation, collected, request.arrival_ns, turn, remote)
            handoff = None
            if part == "send":
                handoff = self._handoff(api, response_id, request.arrival_ns)
            nan = self._nan(number)
            body = await self._full_body(api, collected.events, response_id, nan, handoff)
            if body is None:
                # A NaN logprob cannot be JSON-encoded: vLLM's JSON response fails with 500.
                record.status = 500
                responder.send(
                    500, b"Internal Server Error", content_type="text/plain; charset=utf-8"
                )
                record.ended("done", time.monotonic_ns())
                return
            record.status = 200
            responder.send(200, body, headers=headers)
            record.ended("done", time.monotonic_ns())
            return

        # Headers go out at once, as with vLLM; the body waits for the first token.
        responder.start_stream(headers=headers)
        record.status = 200
        number = self._count_generation_start()
        encoder = StreamEncoder(
            api,
            request_id=response_id,
            model=cfg.model,
            tokenizer=self.tokenizer,
            nan_logprobs=self._nan(number),
        )
        output = StreamOutput(
            responder,
            encoder,
            record,
            self.faults.for_stream(number, api.generation.max_tokens),
            self.stream_faults,
            chat=api.endpoint == "chat",
            include_usage=api.stream_options.include_usage,
            done=loop.create_future(),
        )
        await self._run(api.generation, output, request.arrival_ns, turn, part == "receive")
        responder.end_stream()

    async def _run(
        self,
        generation: GenerationRequest,
        output: StreamOutput | CollectOutput,
        arrival: int,
        turn: int,
        remote: bool,
    ) -> None:
        """Submit and wait for the last event; a cancelled wait (client gone) aborts it."""
        seq: EngineSeq | None = None
        factor = self.faults.ttft_factor()  # --slow-share, drawn for every generation request
        if factor != 1.0:
            self.slow_requests += 1
        try:
            seq = await self._submit(generation, output, arrival, turn, remote, factor)
            await output.done
        finally:
            if seq is not None and not output.complete:
                self.engine.abort(seq)

    async def _full_body(
        self,
        api: ApiRequest,
        events: list[StreamEvent],
        response_id: str,
        nan: bool,
        kv_transfer: dict[str, Any] | None = None,
    ) -> bytes | None:
        wants_logprobs = api.generation.logprobs is not None or api.prompt_logprobs is not None
        if nan and wants_logprobs:
            return None
        scores = None
        if api.prompt_logprobs is not None:
            scores = await self._score_prompt(api.generation.prompt_token_ids, api.prompt_logprobs)
        return full_response(
            api,
            events,
            request_id=response_id,
            model=self.config.model,
            tokenizer=self.tokenizer,
            prompt_scores=scores,
            kv_transfer=kv_transfer,
        )

    async def _score_prompt(self, prompt: tuple[int, ...], top_n: int) -> list[PromptTokenLogprobs]:
        scores: list[PromptTokenLogprobs] = []
        for start in range(1, len(prompt), _SCORE_CHUNK):
            scores.extend(self.model.prompt_logprobs(prompt, top_n, start, start + _SCORE_CHUNK))
            await asyncio.sleep(0)
        return scores
