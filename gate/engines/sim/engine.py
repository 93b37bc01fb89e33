"""Generation: the decoding state machine and the per-request event schedule.

Split in two on purpose. ``Decoder`` is synchronous and pure (given the model): it turns
sampled tokens into output text, applying EOS, stop tokens, stop strings and max_tokens the
way vLLM does, so it can be tested without a clock. ``SimEngine`` owns the clock: admission
(``--max-num-seqs``), absolute deadlines for each event and the counters behind /metrics. A
future continuous-batching scheduler replaces ``SimEngine.generate`` and keeps ``Decoder``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import numpy as np

from gate.engines.sim.model import EOS_TOKEN_ID, TokenLogprobs, ToyModel, ToyTokenizer
from gate.engines.sim.timing import TimingModel


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


@dataclass(slots=True)
class EngineStats:
    """Counters exported on /metrics; cumulative over the life of the process."""

    running: int = 0
    waiting: int = 0
    finished: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    generation_tokens: int = 0


class SimEngine:
    """Admits requests and paces their events on the monotonic clock."""

    def __init__(
        self,
        model: ToyModel,
        tokenizer: ToyTokenizer,
        timing: TimingModel,
        *,
        tokens_per_event: int = 1,
        max_num_seqs: int = 256,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stats = EngineStats()
        self._timing = timing
        self._tokens_per_event = tokens_per_event
        self._slots = asyncio.Semaphore(max_num_seqs)
        self._seed_rng = random.Random(f"sampling-{seed}")

    def sampling_rng(self, request: GenerationRequest) -> np.random.Generator | None:
        """A per-request generator: seeded requests sample identically in any process."""
        if request.temperature <= 0.0:
            return None
        seed = request.seed if request.seed is not None else self._seed_rng.getrandbits(64)
        return np.random.default_rng(seed)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[StreamEvent, None]:
        """Yield each event at its deadline.

        Deadlines are absolute (previous deadline + gap), so time spent by the consumer or the
        event loop does not push later events back; a late event is sent at once. Callers must
        close the iterator (``contextlib.aclosing``) so an abandoned request frees its slot.
        """
        stats = self.stats
        stats.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            stats.waiting -= 1
        stats.running += 1
        stats.prompt_tokens += len(request.prompt_token_ids)
        decoder = Decoder(self.model, self.tokenizer, request, self.sampling_rng(request))
        finish = "abort"
        try:
            deadline = time.monotonic_ns() + self._timing.first_event_delay_ns(
                len(request.prompt_token_ids)
            )
            while True:
                # Decode before sleeping: the work hides inside the gap instead of adding to it.
                event = decoder.step(self._tokens_per_event)
                delay_ns = deadline - time.monotonic_ns()
                if delay_ns > 0:
                    await asyncio.sleep(delay_ns / 1e9)
                stats.generation_tokens += len(event.token_ids)
                yield event
                if event.finish_reason is not None:
                    finish = event.finish_reason
                    return
                deadline += self._timing.next_event_delay_ns(stats.running)
        finally:
            stats.running -= 1
            stats.finished[finish] += 1
            self._slots.release()
