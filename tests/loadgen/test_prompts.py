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
