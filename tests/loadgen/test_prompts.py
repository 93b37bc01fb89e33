"""Synthetic prompts: exact word counts, distinct, reproducible, no downloads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.prompts import WORDS, chat_messages, synthetic_prompts


@given(st.integers(0, 60), st.integers(1, 300), st.integers(0, 1000))
def test_exact_word_counts_and_distinct(n: int, tokens: int, seed: int) -> None:
    prompts = synthetic_prompts(n, tokens, seed=seed)
    assert len(prompts) == n
    assert len(set(prompts)) == n
    for prompt in prompts:
        words = prompt.split()
        assert len(words) == tokens
        assert prompt == " ".join(words)  # single spaces, no leading or trailing space
        assert set(words) <= set(WORDS)


def test_reproducible_by_seed_and_prefix_stable() -> None:
    a = synthetic_prompts(50, 32, seed=9)
    assert a == synthetic_prompts(50, 32, seed=9)
    assert a != synthetic_prompts(50, 32, seed=10)
    assert synthetic_prompts(80, 32, seed=9)[:50] == a


def test_one_word_prompts_up_to_half_the_vocabulary() -> None:
    prompts = synthetic_prompts(len(WORDS) // 2, 1)
    assert len(set(prompts)) == len(prompts)
    with pytest.raises(ValueError, match=r"^n:"):
        synthetic_prompts(len(WORDS), 1)


def test_word_list_is_clean() -> None:
    assert len(WORDS) == len(set(WORDS)) >= 500
    assert all(w.isalpha() and w.islower() for w in WORDS)


@pytest.mark.parametrize(
    ("args", "name"), [((-1, 3), "n"), ((2, 0), "prompt_tokens"), ((2, True), "prompt_tokens")]
)
def test_bad_input_names_the_parameter(args: tuple[int, int], name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}:"):
        synthetic_prompts(*args)


def test_chat_messages() -> None:
    assert chat_messages("hi there") == [{"role": "user", "content": "hi there"}]


# --------------------------------------------------------------------------- distributions etc.

import numpy as np  # noqa: E402

from loadgen.prompts import (  # noqa: E402
    LengthDist,
    sample_lengths,
    shared_prefix_prompts,
    synthetic_conversations,
    varied_prompts,
)


@pytest.mark.parametrize(
    "dist",
    [
        LengthDist("fixed", 64),
        LengthDist("uniform", 64, 32),
        LengthDist("normal", 64, 10),
        LengthDist("lognormal", 64, 0.5),
    ],
)
def test_length_distributions_reproducible_and_right_mean(dist: LengthDist) -> None:
    a = sample_lengths(4000, dist, seed=5)
    assert a == sample_lengths(4000, dist, seed=5)
    assert sample_lengths(100, dist, seed=5) == a[:100]  # prefix-stable
    assert all(isinstance(x, int) and x >= 1 for x in a)
    assert np.mean(a) == pytest.approx(64, rel=0.05)
    if dist.kind == "uniform":
        assert min(a) >= 32 and max(a) <= 96
    if dist.kind == "lognormal":
        assert np.median(a) < np.mean(a)  # right-skewed
    prompts = varied_prompts(50, dist, seed=5)
    assert prompts == varied_prompts(50, dist, seed=5)
    assert [len(p.split()) for p in prompts] == sample_lengths(50, dist, seed=5)


def test_length_dist_parse_and_clip() -> None:
    assert LengthDist.parse("128") == LengthDist("fixed", 128)
    assert LengthDist.parse("lognormal:256:0.6") == LengthDist("lognormal", 256, 0.6)
    clipped = LengthDist("normal", 10, 50, minimum=5, maximum=12)
    assert set(sample_lengths(500, clipped)) <= set(range(5, 13))
    with pytest.raises(ValueError, match="not a length distribution"):
        LengthDist.parse("zipf:3")
    with pytest.raises(ValueError, match=r"^mean"):
        LengthDist("fixed", 0)


def test_shared_prefix_groups() -> None:
    prompts = shared_prefix_prompts(12, groups=3, prefix_tokens=20, suffix=LengthDist("fixed", 5))
    assert prompts == shared_prefix_prompts(
        12, groups=3, prefix_tokens=20, suffix=LengthDist("fixed", 5)
    )
    prefixes = [" ".join(p.split()[:20]) for p in prompts]
    assert len(set(prefixes)) == 3
    assert all(prefixes[i] == prefixes[i % 3] for i in range(12))
    assert all(len(p.split()) == 25 for p in prompts)
    assert len(set(prompts)) == 12


def test_synthetic_conversations() -> None:
    convs = synthetic_conversations(4, turns=3, lengths=LengthDist("fixed", 6), seed=2)
    assert convs == synthetic_conversations(4, turns=3, lengths=LengthDist("fixed", 6), seed=2)
    assert [len(c.turns) for c in convs] == [3] * 4
    assert all(len(t.split()) == 6 for c in convs for t in c.turns)
