"""The toy model is pure: determinism and probability laws are checked without a server."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simengine.model import (
    BUG_MIN_GAP,
    BUG_MIN_RANK,
    EOS_TOKEN_ID,
    LOGPROB_FLOOR,
    TIE_MAX_LEAD,
    TIE_RATE,
    TOP1_MARGIN,
    Numerics,
    ToyModel,
    ToyTokenizer,
    build_vocabulary,
    render_chat,
)

VOCAB = 4096
TOKENIZER = ToyTokenizer(VOCAB)
MODEL = ToyModel(VOCAB, seed=0)

contexts = st.lists(st.integers(min_value=0, max_value=VOCAB - 1), min_size=0, max_size=6)
word_ids = st.lists(st.integers(min_value=1, max_value=VOCAB - 1), max_size=40)


def test_vocabulary_is_fixed_unique_and_pronounceable() -> None:
    vocab = build_vocabulary(VOCAB)
    assert vocab == build_vocabulary(VOCAB)
    assert len(set(vocab)) == VOCAB
    assert vocab[EOS_TOKEN_ID] == "</s>"
    assert all(re.fullmatch(r"[a-z]+", w) for w in vocab[1:])
    # A bigger vocabulary extends, rather than reshuffles, a smaller one.
    assert build_vocabulary(8192)[:VOCAB] == vocab


def test_known_words_map_to_their_index_and_others_hash_stably() -> None:
    assert TOKENIZER.encode(TOKENIZER.vocabulary[17]) == [17]
    ids = TOKENIZER.encode("hello   world\nhello")
    assert ids[0] == ids[2] != ids[1]
    assert ids == ToyTokenizer(VOCAB).encode("hello world hello")


@given(st.text(max_size=200))
def test_one_token_per_whitespace_separated_word(text: str) -> None:
    ids = TOKENIZER.encode(text)
    assert len(ids) == len(text.split()) == TOKENIZER.count(text)
    assert all(1 <= i < VOCAB for i in ids)  # text never produces EOS


@given(word_ids)
def test_decode_then_encode_round_trips(ids: list[int]) -> None:
    text = TOKENIZER.decode(ids)
    assert TOKENIZER.encode(text) == ids
    assert TOKENIZER.count(text) == len(ids)


def test_eos_has_no_output_text_but_a_visible_logprob_form() -> None:
    assert TOKENIZER.token_text(EOS_TOKEN_ID) == ""
    assert TOKENIZER.token_str(EOS_TOKEN_ID) == "</s>"
    assert TOKENIZER.decode([5, EOS_TOKEN_ID]) == TOKENIZER.token_text(5)


def test_chat_template_counts_role_markers_as_tokens() -> None:
    text = render_chat([("system", "be brief"), ("user", "hi there")])
    assert text == "<|system|> be brief <|user|> hi there <|assistant|>"
    assert TOKENIZER.count(text) == 7


def _greedy_run(model: ToyModel, prompt: list[int], n: int) -> list[int]:
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(model.greedy(ctx, allow_eos=False))
    return ctx[len(prompt) :]


def test_greedy_is_deterministic_per_seed() -> None:
    prompt = TOKENIZER.encode("the quick brown fox")
    a = _greedy_run(ToyModel(VOCAB, seed=0), prompt, 50)
    b = _greedy_run(ToyModel(VOCAB, seed=0), prompt, 50)
    c = _greedy_run(ToyModel(VOCAB, seed=1), prompt, 50)
    assert a == b
    assert a != c
    np.testing.assert_array_equal(
        ToyModel(VOCAB, seed=3).logprobs(prompt), ToyModel(VOCAB, seed=3).logprobs(prompt)
    )


def test_only_the_last_few_tokens_matter() -> None:
    tail = [11, 22, 33]
    assert MODEL.greedy([1, 2, *tail]) == MODEL.greedy([9, *tail]) == MODEL.greedy(tail)


@settings(max_examples=60, deadline=None)
@given(contexts, st.booleans())
def test_logprobs_are_log_softmax_with_greedy_on_top(ctx: list[int], allow_eos: bool) -> None:
    lp = MODEL.logprobs(ctx, allow_eos=allow_eos)
    assert lp.shape == (VOCAB,)
    assert np.all(lp <= 0.0)
    assert math.isclose(float(np.exp(lp).sum()), 1.0, rel_tol=1e-9)
    greedy = MODEL.greedy(ctx, allow_eos=allow_eos)
    assert int(np.argmax(lp)) == greedy
    runner_up = float(np.sort(lp)[-2])
    lead = float(lp[greedy]) - runner_up
    # Confident positions lead by TOP1_MARGIN or more; near-ties by less than TIE_MAX_LEAD.
    assert lead >= TOP1_MARGIN - 1e-9 or 0.0 < lead < TIE_MAX_LEAD
    # Raw logits differ from logprobs by one constant.
    z = MODEL.logits(ctx, allow_eos=allow_eos)
    finite = np.isfinite(z)
    assert np.ptp(z[finite] - lp[finite]) < 1e-9
    if not allow_eos:
        assert lp[EOS_TOKEN_ID] == -np.inf


def test_eos_is_rare_and_banned_when_not_allowed() -> None:
    rng = np.random.default_rng(0)
    ctxs = rng.integers(0, VOCAB, size=(20_000, 3)).tolist()
    eos = sum(MODEL.greedy(c) == EOS_TOKEN_ID for c in ctxs)
    assert 0 < eos < 20_000 * 0.01
    assert all(MODEL.greedy(c, allow_eos=False) != EOS_TOKEN_ID for c in ctxs)


def test_describe_reports_sorted_top_n_and_clamps_minus_infinity() -> None:
    ctx = [1, 2, 3]
    best = MODEL.greedy(ctx)
    d = MODEL.describe(ctx, best, 5)
    assert d.token_id == best
    assert len(d.top) == 5
    assert d.top[0] == (best, d.logprob)
    values = [v for _, v in d.top]
    assert values == sorted(values, reverse=True)
    assert MODEL.describe(ctx, EOS_TOKEN_ID, 0, allow_eos=False).logprob == LOGPROB_FLOOR
    assert MODEL.describe(ctx, best, 0).top == ()


def test_sampling_is_seeded_and_follows_the_probabilities() -> None:
    ctx = [4, 5, 6]

    def draws(seed: int, n: int) -> list[int]:
        rng = np.random.default_rng(seed)
        return [MODEL.next_token(ctx, temperature=1.0, rng=rng) for _ in range(n)]

    assert draws(1, 50) == draws(1, 50)
    sample = draws(2, 4000)
    p_top = math.exp(float(MODEL.logprobs(ctx).max()))
    freq = sample.count(MODEL.greedy(ctx)) / len(sample)
    assert freq == pytest.approx(p_top, abs=0.04)
    # Temperature 0 is greedy regardless of the generator.
    assert MODEL.next_token(ctx, temperature=0.0, rng=np.random.default_rng(0)) == MODEL.greedy(ctx)


def test_sampling_never_picks_a_banned_eos() -> None:
    rng = np.random.default_rng(0)
    ctxs = rng.integers(0, VOCAB, size=(300, 3)).tolist()
    for c in ctxs:
        assert MODEL.next_token(c, temperature=5.0, rng=rng, allow_eos=False) != EOS_TOKEN_ID


def _leads(model: ToyModel, ctxs: list[list[int]]) -> np.ndarray:
    out = []
    for c in ctxs:
        lp = model.logprobs(c, allow_eos=False)
        top2 = np.sort(lp)[-2:]
        out.append(float(top2[1] - top2[0]))
    return np.array(out)


CTXS = np.random.default_rng(7).integers(1, VOCAB, size=(6000, 3)).tolist()


def test_near_ties_exist_at_the_configured_rate() -> None:
    leads = _leads(MODEL, CTXS[:3000])
    ties = float(np.mean(leads < TIE_MAX_LEAD))
    assert ties == pytest.approx(TIE_RATE, abs=0.02)
    assert np.all((leads < TIE_MAX_LEAD) | (leads >= TOP1_MARGIN - 1e-9))


def test_logit_noise_flips_only_near_ties() -> None:
    sigma = 0.05
    noisy = ToyModel(VOCAB, numerics=Numerics(noise_sigma=sigma, seed=3))
    flips = []
    for c in CTXS:
        clean = MODEL.greedy(c, allow_eos=False)
        got = noisy.greedy(c, allow_eos=False)
        # The fast path agrees with the full noisy logits everywhere.
        assert got == int(np.argmax(noisy.logits(c, allow_eos=False)))
        if got != clean:
            lp = MODEL.logprobs(c, allow_eos=False)
            flips.append(float(lp[clean] - lp[got]))
    assert 0 < len(flips) < 0.02 * len(CTXS)
    # Only tokens within a few sigmas of the top can overtake it.
    assert max(flips) < 8 * sigma
    # Logprobs move by about sigma, not more.
    lp_clean = MODEL.logprobs(CTXS[0])
    lp_noisy = noisy.logprobs(CTXS[0])
    assert float(np.std(lp_noisy - lp_clean)) == pytest.approx(sigma, rel=0.2)
    # Reproducible: same seed, same noise; another seed, other noise.
    again = ToyModel(VOCAB, numerics=Numerics(noise_sigma=sigma, seed=3))
    np.testing.assert_array_equal(again.logits(CTXS[1]), noisy.logits(CTXS[1]))
    other = ToyModel(VOCAB, numerics=Numerics(noise_sigma=sigma, seed=4))
    assert not np.array_equal(other.logits(CTXS[1]), noisy.logits(CTXS[1]))


def test_numeric_bug_flips_confident_positions_to_unlikely_tokens() -> None:
    rate = 0.05
    buggy = ToyModel(VOCAB, numerics=Numerics(bug_rate=rate, seed=1))
    flips = 0
    for c in CTXS[:4000]:
        clean = MODEL.greedy(c, allow_eos=False)
        got = buggy.greedy(c, allow_eos=False)
        if got == clean:
            continue
        flips += 1
        lp = MODEL.logprobs(c, allow_eos=False)
        # In the reference model the chosen token is far below the top: a large margin.
        assert float(lp[clean] - lp[got]) >= BUG_MIN_GAP - 1e-9
        assert 1 + int(np.count_nonzero(lp > lp[got])) >= BUG_MIN_RANK
        # The buggy model is sure of its wrong choice, so its logprobs show it.
        assert int(np.argmax(buggy.logprobs(c, allow_eos=False))) == got
    assert flips / 4000 == pytest.approx(rate, abs=0.015)


def test_prompt_logprobs_score_each_token_given_its_prefix() -> None:
    prompt = TOKENIZER.encode("the quick brown fox jumps over the lazy dog")
    scores = MODEL.prompt_logprobs(prompt, 3)
    assert len(scores) == len(prompt) - 1
    for i, score in enumerate(scores, start=1):
        lp = MODEL.logprobs(prompt[max(0, i - 3) : i])
        assert score.token_id == prompt[i]
        assert score.logprob == pytest.approx(float(lp[prompt[i]]))
        assert score.rank == 1 + int(np.count_nonzero(lp > lp[prompt[i]]))
        assert [t for t, _ in score.top] == list(np.argsort(-lp)[:3])
    # Pieces add up to the whole, so a server may score in slices.
    assert MODEL.prompt_logprobs(prompt, 3, 1, 4) + MODEL.prompt_logprobs(prompt, 3, 4) == scores
    # Scoring the model's own greedy continuation gives rank 1 everywhere after the prompt.
    ctx = list(prompt)
    for _ in range(10):
        ctx.append(MODEL.greedy(ctx))
    tail = MODEL.prompt_logprobs(ctx, 0, len(prompt))
    assert all(s.rank == 1 for s in tail)
    assert all(s.top == () for s in tail)
