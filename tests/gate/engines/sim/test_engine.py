"""Decoding rules (stop conditions, hold-back of text) and the engine's admission and pacing."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.engines.sim.config import SimConfig
from gate.engines.sim.engine import Decoder, GenerationRequest, SimEngine, StreamEvent
from gate.engines.sim.model import EOS_TOKEN_ID, ToyModel, ToyTokenizer
from gate.engines.sim.timing import TimingModel

VOCAB = 4096
TOKENIZER = ToyTokenizer(VOCAB)
MODEL = ToyModel(VOCAB, seed=0)
PROMPT = tuple(TOKENIZER.encode("once upon a time"))


def run(request: GenerationRequest, per_step: int = 1) -> list[StreamEvent]:
    decoder = Decoder(MODEL, TOKENIZER, request)
    events = []
    while not decoder.finished:
        events.append(decoder.step(per_step))
    return events


def joined(events: list[StreamEvent]) -> tuple[str, list[int]]:
    return "".join(e.text for e in events), [t for e in events for t in e.token_ids]


def greedy(max_tokens: int = 12, **kw: object) -> GenerationRequest:
    base = GenerationRequest(prompt_token_ids=PROMPT, max_tokens=max_tokens, ignore_eos=True)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_length_finish_and_token_accounting() -> None:
    events = run(greedy(10), per_step=3)
    assert [len(e.token_ids) for e in events] == [3, 3, 3, 1]
    assert [e.completion_tokens for e in events] == [3, 6, 9, 10]
    assert [e.finish_reason for e in events] == [None, None, None, "length"]
    text, ids = joined(events)
    assert text == TOKENIZER.decode(ids)
    offsets = [e.text_offset for e in events]
    assert offsets == [0, *(len("".join(e.text for e in events[:i])) for i in range(1, 4))]


def test_stop_string_cuts_text_and_reports_itself() -> None:
    _, ids = joined(run(greedy()))
    word = TOKENIZER.token_text(ids[4]).strip()
    events = run(greedy(stop=("zzz-never", word)))
    text, out_ids = joined(events)
    assert events[-1].finish_reason == "stop"
    assert events[-1].stop_reason == word
    assert out_ids == ids[:5]  # the token completing the stop string is still reported
    assert text == TOKENIZER.decode(ids[:4]) + " "
    with_stop = run(greedy(stop=(word,), include_stop_str_in_output=True))
    assert joined(with_stop)[0] == TOKENIZER.decode(ids[:5])


def test_stop_string_spanning_tokens_is_never_leaked_early() -> None:
    _, ids = joined(run(greedy()))
    full = TOKENIZER.decode(ids)
    # The end of word 3, the space, and the start of word 4.
    boundary = len(TOKENIZER.decode(ids[:3]))
    stop = full[boundary - 2 : boundary + 3]
    events = run(greedy(stop=(stop,)))
    text, _ = joined(events)
    assert text == full[: full.index(stop)]
    assert events[-1].stop_reason == stop
    released = ""
    for event in events:
        released += event.text
        assert stop not in released


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=11), st.integers(1, 5), st.integers(1, 4))
def test_streamed_text_equals_final_text(start: int, length: int, per_step: int) -> None:
    _, ids = joined(run(greedy()))
    full = TOKENIZER.decode(ids)
    stop = full[start : start + length]
    events = run(greedy(stop=(stop,)), per_step=per_step)
    text, _ = joined(events)
    assert text == full[: full.index(stop)]


def test_stop_token_ids_and_min_tokens() -> None:
    _, ids = joined(run(greedy()))
    events = run(greedy(stop_token_ids=frozenset({ids[2]})))
    assert events[-1].finish_reason == "stop"
    assert events[-1].stop_reason == ids[2]
    assert joined(events)[1] == ids[:3]
    later = run(greedy(stop_token_ids=frozenset({ids[2]}), min_tokens=4))
    assert later[-1].finish_reason == "length"


def _prompt_that_ends_early() -> tuple[int, ...]:
    for i in range(20_000):
        prompt = (1, 2, i % (VOCAB - 1) + 1)
        if MODEL.greedy(prompt) == EOS_TOKEN_ID:
            return prompt
    raise AssertionError("no EOS context found")


def test_eos_stops_unless_ignored() -> None:
    prompt = _prompt_that_ends_early()
    stopped = run(GenerationRequest(prompt_token_ids=prompt, max_tokens=5))
    assert len(stopped) == 1
    assert stopped[0].token_ids == (EOS_TOKEN_ID,)
    assert (stopped[0].finish_reason, stopped[0].stop_reason, stopped[0].text) == ("stop", None, "")
    ignored = run(GenerationRequest(prompt_token_ids=prompt, max_tokens=5, ignore_eos=True))
    assert ignored[-1].finish_reason == "length"
    assert EOS_TOKEN_ID not in joined(ignored)[1]
    delayed = run(GenerationRequest(prompt_token_ids=prompt, max_tokens=5, min_tokens=2))
    assert EOS_TOKEN_ID not in delayed[0].token_ids


def test_logprobs_follow_the_tokens() -> None:
    events = run(greedy(5, logprobs=3), per_step=2)
    for event in events:
        assert event.logprobs is not None
        assert [lp.token_id for lp in event.logprobs] == list(event.token_ids)
        for lp in event.logprobs:
            assert len(lp.top) == 3
            assert lp.top[0][0] == lp.token_id
    assert run(greedy(5))[0].logprobs is None


def test_seeded_sampling_is_reproducible() -> None:
    req = greedy(20, temperature=1.0, seed=42)

    def sampled(engine: SimEngine) -> tuple[str, list[int]]:
        decoder = Decoder(MODEL, TOKENIZER, req, engine.sampling_rng(req))
        return joined([decoder.step(20)])

    assert sampled(_engine()) == sampled(_engine(seed=9))
    assert sampled(_engine()) != joined(run(greedy(20)))
    assert _engine().sampling_rng(greedy(20)) is None


def test_finished_decoder_refuses_more_steps() -> None:
    decoder = Decoder(MODEL, TOKENIZER, greedy(1))
    decoder.step(1)
    with pytest.raises(RuntimeError):
        decoder.step(1)


def _engine(**overrides: object) -> SimEngine:
    config = dataclasses.replace(
        SimConfig(port=0, ttft_ms=30, itl_ms=10, jitter=0, prefill_us_per_token=0), **overrides
    )  # type: ignore[arg-type]
    return SimEngine(
        MODEL,
        TOKENIZER,
        TimingModel(config),
        tokens_per_event=config.tokens_per_event,
        max_num_seqs=config.max_num_seqs,
        seed=config.seed,
    )


def test_events_follow_absolute_deadlines() -> None:
    engine = _engine(itl_per_running_ms=0)

    async def main() -> list[float]:
        start = time.monotonic()
        stamps = []
        async for _ in engine.generate(greedy(6)):
            stamps.append(time.monotonic() - start)
            await asyncio.sleep(0.004)  # a slow consumer must not push later events back
        return stamps

    stamps = asyncio.run(main())
    expected = [0.030 + 0.010 * i for i in range(6)]
    for got, want in zip(stamps, expected, strict=True):
        assert want - 0.001 <= got <= want + 0.008
    assert engine.stats.finished["length"] == 1
    assert engine.stats.generation_tokens == 6


def test_admission_limit_makes_requests_wait() -> None:
    engine = _engine(max_num_seqs=1)
    seen: list[tuple[int, int]] = []

    async def consume() -> None:
        async for _ in engine.generate(greedy(3)):
            seen.append((engine.stats.running, engine.stats.waiting))

    async def main() -> None:
        await asyncio.gather(consume(), consume())

    asyncio.run(main())
    assert (1, 1) in seen  # one generating, one queued behind it
    assert seen[-1] == (1, 0)
    assert engine.stats.running == engine.stats.waiting == 0


def test_abandoned_stream_counts_as_abort_and_frees_its_slot() -> None:
    engine = _engine(max_num_seqs=1)

    async def main() -> None:
        events = engine.generate(greedy(50))
        await anext(events)
        await events.aclose()
        async for _ in engine.generate(greedy(1)):
            pass

    asyncio.run(main())
    assert engine.stats.finished["abort"] == 1
    assert engine.stats.finished["length"] == 1
    assert engine.stats.running == 0
