"""Generation: the decoding state machine and the engine loop that paces every request.

Split in two on purpose. ``Decoder`` is synchronous and pure (given the model): it turns
sampled tokens into output text, applying EOS, stop tokens, stop strings and max_tokens the
way vLLM does, so it can be tested without a clock. ``SimEngine`` owns the clock: one loop
steps like a real engine (the scheduler picks the batch, the timer says how long the step
takes, every sequence in it gets its token at the step's end), and hands each event to the
request's ``Output`` at its emission time.

Why one loop and not a task per request: at thousands of events per second, waking a
coroutine per event costs more than the event itself, and per-request timers drift apart. The
loop renders each step's events before the step ends (``Output.prepare``) and at the end only
writes them out (``Output.deliver``), so the events of one step leave within microseconds of
each other. It sleeps with the event loop until about a millisecond before a deadline, then
with ``time.sleep`` for the rest, because asyncio's epoll timeouts round up to whole
milliseconds and would make every event up to a millisecond late.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from simengine.model import EOS_TOKEN_ID, TokenLogprobs, ToyModel, ToyTokenizer
from simengine.scheduler import Scheduler, SeqState, SeqStatus, StepPlan
from simengine.timing import StepTimer


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Validated sampling parameters, independent of which OpenAI endpoint they came from."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    # Number of alternatives to report per token; None means no logprobs at all.
    logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """What one SSE event carries: the tokens since the last event and the text they release."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...] | None
    finish_reason: str | None
    stop_reason: str | int | None
    completion_tokens: int
    # Length of the output text released before this event (for completions text_offset).
    text_offset: int


class Decoder:
    """Incremental decoding of one request.

    Stop strings may straddle tokens, so while any are set the last ``len(longest) - 1``
    characters are held back until it is certain they do not begin a stop string; the held
    text is released when the request finishes. Tokens are reported as soon as they are
    sampled, including the one that completes a stop string (whose text is cut).
    """

    def __init__(
        self,
        model: ToyModel,
        tokenizer: ToyTokenizer,
        request: GenerationRequest,
        rng: np.random.Generator | None = None,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._req = request
        self._rng = rng
        self._stops = tuple(s for s in request.stop if s)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._holdback = max(0, self._max_stop - 1)
        keep = model.context_size
        self._context: list[int] = list(request.prompt_token_ids[-keep:]) if keep else []
        self._num_generated = 0
        self._text = ""
        self._sent = 0
        self.finished = False

    @property
    def num_generated(self) -> int:
        return self._num_generated

    def step(self, max_new_tokens: int) -> StreamEvent:
        """Sample up to ``max_new_tokens`` tokens, stopping early if the request finishes."""
        if self.finished:
            raise RuntimeError("decoder already finished")
        req = self._req
        model = self._model
        ids: list[int] = []
        lps: list[TokenLogprobs] | None = [] if req.logprobs is not None else None
        finish: str | None = None
        stop_reason: str | int | None = None
        keep = model.context_size
        for _ in range(max_new_tokens):
            past_min = self._num_generated >= req.min_tokens
            allow_eos = past_min and not req.ignore_eos
            ctx = self._context
            tok = model.next_token(
                ctx, temperature=req.temperature, rng=self._rng, allow_eos=allow_eos
            )
            if lps is not None:
                lps.append(model.describe(ctx, tok, req.logprobs or 0, allow_eos=allow_eos))
            ids.append(tok)
            self._num_generated += 1
            ctx.append(tok)
            if len(ctx) > keep:
                del ctx[0]
            if tok == EOS_TOKEN_ID and allow_eos:
                finish = "stop"
            elif past_min and tok in req.stop_token_ids:
                finish, stop_reason = "stop", tok
            else:
                prev_len = len(self._text)
                self._text += self._tokenizer.token_text(tok)
                if self._stops and past_min:
                    hit = self._find_stop(prev_len)
                    if hit is not None:
                        pos, s = hit
                        end = pos + len(s) if req.include_stop_str_in_output else pos
                        self._text = self._text[:end]
                        finish, stop_reason = "stop", s
            if finish is None and self._num_generated >= req.max_tokens:
                finish = "length"
            if finish is not None:
                break

        offset = self._sent
        if finish is not None:
            self.finished = True
            release = len(self._text)
        else:
            release = max(self._sent, len(self._text) - self._holdback)
        delta = self._text[self._sent : release]
        self._sent = release
        return StreamEvent(
            token_ids=tuple(ids),
            text=delta,
            logprobs=tuple(lps) if lps is not None else None,
            finish_reason=finish,
            stop_reason=stop_reason,
            completion_tokens=self._num_generated,
            text_offset=offset,
        )

    def _find_stop(self, prev_len: int) -> tuple[int, str] | None:
        # Only a match that ends in the new text can be new; earlier text was already checked.
        best: tuple[int, str] | None = None
        for s in self._stops:
            pos = self._text.find(s, max(0, prev_len - len(s) + 1))
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        return best


def merge_events(events: Sequence[StreamEvent]) -> StreamEvent:
    """One event carrying several consecutive events' tokens (``--tokens-per-event``)."""
    if len(events) == 1:
        return events[0]
    first, last = events[0], events[-1]
    lps: tuple[TokenLogprobs, ...] | None = None
    if first.logprobs is not None:
        lps = tuple(lp for ev in events for lp in (ev.logprobs or ()))
    return StreamEvent(
        token_ids=tuple(t for ev in events for t in ev.token_ids),
        text="".join(ev.text for ev in events),
        logprobs=lps,
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        completion_tokens=last.completion_tokens,
        text_offset=first.text_offset,
    )


class Output(Protocol):
    """Where a request's events go: an SSE stream, a collector for a JSON response, a test.

    ``prepare`` is called when the engine samples (ahead of the emission time, in order) so
    the wire bytes are ready; ``deliver`` at the emission time. ``deliver`` returning False
    stops the request (a fault took over): the engine frees its place in the batch.
    """

    def prepare(self, event: StreamEvent) -> bytes: ...

    def deliver(self, event: StreamEvent, data: bytes, scheduled_ns: int) -> bool: ...


@dataclass(slots=True)
class EngineStats:
    """Counters exported on /metrics; cumulative over the life of the process."""

    finished: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0


@dataclass(eq=False, slots=True)
class EngineSeq(SeqState):
    """A request inside the engine: scheduling state plus its decoder and output."""

    decoder: Decoder | None = None
    output: Output | None = None
    # Earliest first token (the --ttft-ms floor); every event is shifted by `offset_ns`, fixed
    # when the first token is sampled, so the floor never changes the gaps between tokens.
    floor_ns: int = 0
    offset_ns: int = -1
    # A slow request (--slow-share) or a creeping TTFT (--degrade-ttft-per-min): its time to
    # first token, counted from `arrival_ns`, is multiplied by `ttft_factor` by holding the
    # first token (and so every later one) back by the difference.
    arrival_ns: int = 0
    ttft_factor: float = 1.0
    buffered: list[StreamEvent] = field(default_factory=list)
    counted_prompt: bool = False
    dead: bool = False


@dataclass(slots=True)
class _Step:
    end_ns: int
    outputs: list[tuple[EngineSeq, StreamEvent, bytes]]


# Request intake (parsing, tokenizing, admitting a new request) gets turns in the slack before
# the next deadline, ending this far from it at the latest; one per step even without slack.
_INTAKE_MARGIN_NS = 300_000
_INTAKE_COST_NS = 150_000  # first guess of one request's intake work; then measured (EWMA)
# A step may start this far in the past when the loop is late; beyond it the schedule resyncs.
_MAX_LAG_NS = 20_000_000
# Sleep with the event loop until this close to a deadline, then with time.sleep.
_FINE_SLEEP_NS = 1_200_000
_COARSE_MARGIN_NS = 1_000_000


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class SimEngine:
    """The engine loop: schedules steps, keeps their deadlines, emits events."""

    def __init__(
        self,
        model: ToyModel,
        tokenizer: ToyTokenizer,
        timer: StepTimer,
        *,
        tokens_per_event: int = 1,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        kv_cache_tokens: int = 0,
        seed: int = 0,
        stalls: Sequence[tuple[float, float]] = (),
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.timer = timer
        self.stats = EngineStats()
        self.scheduler: Scheduler[EngineSeq] = Scheduler(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_tokens=kv_cache_tokens,
        )
        self._tokens_per_event = tokens_per_event
        self._seed_rng = random.Random(f"sampling-{seed}")
        self._step: _Step | None = None
        self._pending: list[tuple[int, int, EngineSeq, StreamEvent, bytes]] = []
        self._order = itertools.count()
        self._waiter: asyncio.Future[None] | None = None
        self._last_end_ns = 0
        self._chained = False
        self._intake: deque[asyncio.Future[int]] = deque()
        self._intake_cost_ns = float(_INTAKE_COST_NS)
        self._turn_given = False  # an intake turn since the last step ended
        self._turn_deadline: int | None = None  # the deadline the current turns must meet
        self._step_len_ns = 0  # planned length of the latest step
        # --stalls: (at, for) seconds after the first request arrived; absolute windows
        # [start, end) in ns once it has.
        self._stalls = tuple(sorted(stalls))
        self._stall_windows: tuple[tuple[int, int], ...] = ()
        self.stall_origin_ns: int | None = None

    # -- requests ------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    def sampling_rng(self, request: GenerationRequest) -> np.random.Generator | None:
        """A per-request generator: seeded requests sample identically in any process."""
        if request.temperature <= 0.0:
            return None
        seed = request.seed if request.seed is not None else self._seed_rng.getrandbits(64)
        return np.random.default_rng(seed)

    async def intake_turn(self) -> int:
        """Wait for a turn to take a new request in; returns when the turn began.

        A burst of requests parsed and tokenized on this loop in one go would delay the next
        step's writes by their whole cost (64 requests arriving together: milliseconds). So,
        as vLLM adds requests to its engine between steps, a busy engine gives intake turns
        one at a time, each only while the slack before its next deadline still holds the
        measured cost of one (`took_in` ends a turn and passes the next on), and at least
        one per step. An idle engine gives them at once."""
        if (
            self._step is None
            and not self._pending
            and not self._intake
            and not self.scheduler.has_work()
        ):
            return time.monotonic_ns()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._intake.append(fut)
        if self._waiter is not None:
            _wake(self._waiter)  # the loop decides whether a turn fits now
        return await fut

    def took_in(self, cost_ns: int) -> None:
        """A turn ended (its request submitted, or refused) after `cost_ns` of work: update
        the estimate, and pass a turn on if the next one still fits before the deadline."""
        self._intake_cost_ns += 0.2 * (max(0, cost_ns) - self._intake_cost_ns)
        self._give_turn(time.monotonic_ns(), self._turn_deadline)

    @property
    def intake_waiting(self) -> int:
        return sum(1 for f in self._intake if not f.done())

    def _give_turn(self, now: int, deadline: int | None) -> None:
        """One intake turn if it fits (the slack before the deadline holds one intake's
        cost, or no turn was given since the last step ended); every waiting one when there
        is no deadline ahead or steps are shorter than an intake."""
        queue = self._intake
        while queue and queue[0].done():  # a client that left while waiting
            queue.popleft()
        if not queue:
            return
        self._turn_deadline = deadline
        if deadline is None or self._step_len_ns < self._intake_cost_ns:
            # Idle, or steps shorter than one intake (zero-cost steps in a throughput run):
            # no slack could ever hold a turn, and holding requests back protects nothing.
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(now)
            self._turn_given = True
            return
        fits = deadline - now - _INTAKE_MARGIN_NS >= self._intake_cost_ns
        if not fits and self._turn_given:
            return
        queue.popleft().set_result(now)
        self._turn_given = True

    def submit(
        self,
        request: GenerationRequest,
        output: Output,
        *,
        arrival_ns: int | None = None,
        remote_prefill: bool = False,
        ttft_factor: float = 1.0,
    ) -> EngineSeq:
        """Queue a request; its events go to ``output``. ``arrival_ns`` anchors the TTFT floor.

        ``ttft_factor``: its time to first token is multiplied by this (a slow request), and
        by the timer's creep at its arrival (``--degrade-ttft-per-min``).

        ``remote_prefill``: a prefill worker computed the prompt and its KV is here (a
        disaggregated decode). All of it but the last position is placed without compute, as
        vLLM recomputes the last token of a wholly cached prompt for its logits; no TTFT floor,
        which the prefill worker already kept."""
        now = time.monotonic_ns()
        arrival = now if arrival_ns is None else arrival_ns
        if self.stall_origin_ns is None:
            self._start_stall_clock(arrival)
        prompt_len = len(request.prompt_token_ids)
        if remote_prefill:
            remote_kv, floor_ns = max(0, prompt_len - 1), 0
        else:
            remote_kv, floor_ns = 0, arrival + self.timer.first_token_floor_ns(prompt_len)
        seq = EngineSeq(
            prompt_len=prompt_len,
            submitted_ns=now,
            remote_kv=remote_kv,
            decoder=Decoder(self.model, self.tokenizer, request, self.sampling_rng(request)),
            output=output,
            floor_ns=floor_ns,
            arrival_ns=arrival,
            ttft_factor=ttft_factor * self.timer.ttft_degradation(arrival),
        )
        self.scheduler.add(seq)
        if self._step is None and self._waiter is not None:
            _wake(self._waiter)
        return seq

    def abort(self, seq: EngineSeq) -> None:
        """Drop a request (client gone, or a fault stopped it); pending events are discarded."""
        if seq.dead:
            return
        seq.dead = True
        if seq.status is not SeqStatus.FINISHED:
            self.scheduler.remove(seq)
            self.stats.finished["abort"] += 1

    # -- stalls ----------------------------------------------------------------------------

    def _start_stall_clock(self, origin_ns: int) -> None:
        self.stall_origin_ns = origin_ns
        self._stall_windows = tuple(
            (origin_ns + round(at * 1e9), origin_ns + round((at + length) * 1e9))
            for at, length in self._stalls
        )

    def stalled_until(self, at_ns: int) -> int | None:
        """The end of the stall ``at_ns`` falls in, or None when the engine may step then."""
        for start, end in self._stall_windows:
            if start <= at_ns < end:
                return end
        return None

    def _through_stalls(self, start: int, length: int) -> tuple[int, int]:
        """A step planned to start at ``start`` for ``length`` ns, as stalls let it run:
        one starting inside a stall waits for its end, and a stall that begins while the step
        runs stops it for the stall's length (nothing is dropped, everything is later)."""
        end = start + length
        for s0, s1 in self._stall_windows:
            if s0 <= start < s1:
                start, end = s1, s1 + length
            elif start < s0 < end:
                end += s1 - s0
        return start, end

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Step until cancelled."""
        while True:
            now = time.monotonic_ns()
            step = self._step
            if step is not None and now >= step.end_ns:
                self._step = None
                self._finish_step(step)
                # Let requests and disconnects in between steps, even zero-length ones.
                await asyncio.sleep(0)
                continue
            if self._pending and self._pending[0][0] <= now:
                self._deliver_due(now)
            resume = None
            if self._step is None and self.scheduler.has_work():
                resume = self.stalled_until(now)
                if resume is None:
                    self._step = self._begin_step(now)
                    continue
            deadlines = [] if resume is None else [resume]
            if self._step is not None:
                deadlines.append(self._step.end_ns)
            if self._pending:
                deadlines.append(self._pending[0][0])
            deadline = min(deadlines) if deadlines else None
            if self._intake:
                self._give_turn(now, deadline)
            await self._sleep_until(deadline)

    async def _sleep_until(self, deadline_ns: int | None) -> None:
        """Return at ``deadline_ns`` (None: when woken), or earlier when ``submit`` wakes us."""
        if deadline_ns is not None:
            remaining = deadline_ns - time.monotonic_ns()
            if remaining <= 0:
                return
            if remaining <= _FINE_SLEEP_NS:
                # Let pending I/O in first: with deadlines this close together (every request
                # shifted by its own TTFT floor) the loop would otherwise never read a socket.
                await asyncio.sleep(0)
                remaining = deadline_ns - time.monotonic_ns()
                if remaining > 0:
                    # Deliberately blocking: sub-millisecond precision epoll cannot give.
                    time.sleep(remaining / 1e9)  # noqa: ASYNC251
                return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        handle = None
        if deadline_ns is not None:
            delay = (deadline_ns - _COARSE_MARGIN_NS - time.monotonic_ns()) / 1e9
            handle = loop.call_later(max(0.0, delay), _wake, fut)
        self._waiter = fut
        try:
            await fut
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def _begin_step(self, now: int) -> _Step:
        sched = self.scheduler
        if self._chained:
            # Back to back with the last step. A loop that fell far behind (a starved process,
            # zero-cost steps) gives up the lost time instead of bursting through it, as a
            # stalled engine would; a little lateness stays visible in the ground truth.
            start = max(self._last_end_ns, now - _MAX_LAG_NS)
        else:
            # The engine was idle: the step starts when the oldest waiting request came.
            oldest = sched.waiting[0].submitted_ns if sched.waiting else now
            start = max(self._last_end_ns, min(oldest, now))
        # Everything that arrived by now joins, as a real scheduler polling its queue would.
        plan = sched.schedule(now)
        timer = self.timer
        length = timer.step_ns(plan.num_seqs, plan.num_tokens, plan.kv_tokens, start)
        if self._stall_windows:
            start, end = self._through_stalls(start, length)
        else:
            end = start + length
        self._step_len_ns = end - start
        self.stats.steps += 1
        return _Step(end, self._sample(plan, end))

    def _sample(
        self, plan: StepPlan[EngineSeq], end: int
    ) -> list[tuple[EngineSeq, StreamEvent, bytes]]:
        """Decode every sequence that samples in this step and render its event ahead of time."""
        stats = self.stats
        for seq in plan.admitted:
            if not seq.counted_prompt:
                seq.counted_prompt = True
                stats.prompt_tokens += seq.prompt_len
        outputs: list[tuple[EngineSeq, StreamEvent, bytes]] = []
        per_event = self._tokens_per_event
        sampled = self.scheduler.complete(plan)
        stats.generation_tokens += len(sampled)
        for seq in sampled:
            decoder = seq.decoder
            output = seq.output
            assert decoder is not None and output is not None
            event = decoder.step(1)
            if seq.offset_ns < 0:
                offset = max(0, seq.floor_ns - end)
                if seq.ttft_factor != 1.0:
                    # Hold the first token back until TTFT is ttft_factor times what it was.
                    ttft = end + offset - seq.arrival_ns
                    offset += max(0, round((seq.ttft_factor - 1.0) * ttft))
                seq.offset_ns = offset
            finished = event.finish_reason is not None
            if per_event > 1:
                seq.buffered.append(event)
                if not finished and len(seq.buffered) < per_event:
                    continue
                event = merge_events(seq.buffered)
                seq.buffered = []
            if finished:
                self.scheduler.remove(seq)
                stats.finished[event.finish_reason or "stop"] += 1
            outputs.append((seq, event, output.prepare(event)))
        return outputs

    def _finish_step(self, step: _Step) -> None:
        end = step.end_ns
        self._last_end_ns = end
        self._turn_given = False
        pending = self._pending
        for seq, event, data in step.outputs:
            if seq.dead:
                continue
            if seq.offset_ns == 0:
                self._emit(seq, event, data, end)
            else:
                heapq.heappush(pending, (end + seq.offset_ns, next(self._order), seq, event, data))
        self._chained = self.scheduler.has_work()

    def _deliver_due(self, now: int) -> None:
        pending = self._pending
        while pending and pending[0][0] <= now:
            due, _, seq, event, data = heapq.heappop(pending)
            if not seq.dead:
                self._emit(seq, event, data, due)

    def _emit(self, seq: EngineSeq, event: StreamEvent, data: bytes, scheduled_ns: int) -> None:
        output = seq.output
        assert output is not None
        if not output.deliver(event, data, scheduled_ns):
            # A fault took over the request: it leaves the batch, later events are dropped.
            self.abort(seq)
