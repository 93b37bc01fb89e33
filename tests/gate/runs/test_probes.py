"""The correctness stage adapted to what the reference supports (gate/runs/probes.py adapt_to):
never asking for what the reference cannot give, so nothing is held against the candidate for
a feature neither has."""

from __future__ import annotations

import dataclasses

from gate.runs.probes import adapt_to, probe_api
from loadgen import suite
from loadgen.capabilities import Capabilities

FULL = Capabilities(
    completions=True,
    chat=True,
    logprobs=True,
    top_logprobs_max=20,
    prompt_logprobs=True,
    token_ids=True,
    prompt_token_ids=True,
    stream_usage=True,
)


def default() -> suite.Correctness:
    cfg = suite.get("correctness")
    assert isinstance(cfg, suite.Correctness)
    return cfg


def test_a_reference_with_everything_changes_nothing() -> None:
    notes: list[str] = []
    assert adapt_to(default(), FULL, "c", notes) == default() and notes == []
    assert adapt_to(default(), None, "c", notes) == default() and notes == []


def test_fewer_top_logprobs_are_asked_for_when_the_reference_returns_fewer() -> None:
    notes: list[str] = []
    got = adapt_to(default(), dataclasses.replace(FULL, top_logprobs_max=1), "c", notes)
    assert got.top_logprobs == 1 and got.teacher_forced
    assert notes and "at most 1 top logprobs" in notes[0]


def test_no_prompt_logprobs_on_the_reference_means_free_run_only() -> None:
    # llama.cpp as the reference: `prompt_logprobs` and `return_token_ids` ignored
    llamacpp = Capabilities(
        completions=True, chat=True, logprobs=True, top_logprobs_max=20, token_ids=True
    )
    notes: list[str] = []
    got = adapt_to(default(), llamacpp, "c", notes)
    assert not got.teacher_forced and got.top_logprobs == default().top_logprobs
    assert "no prompt logprobs and no prompt token ids" in notes[0]


def test_a_reference_that_serves_only_chat_gets_the_probes_on_chat() -> None:
    notes: list[str] = []
    chat_only = dataclasses.replace(FULL, completions=False)
    assert probe_api(chat_only, "c", notes) == "chat" and "no completions API" in notes[0]
    assert probe_api(FULL, "c", []) == "completions"
    assert probe_api(None, "c", []) == "completions"
    neither = dataclasses.replace(FULL, completions=False, chat=False)
    assert probe_api(neither, "c", []) == "completions"  # its failures say the rest


def test_tokens_are_asked_by_id_only_when_both_engines_name_them_so() -> None:
    """vLLM names tokens `token_id:N` when asked (return_tokens_as_token_ids); an engine that
    ignores the field answers text, and a `token_id:9906` against a "Hello" differs at every
    position. So the probes ask only when both engines showed they honour it."""
    by_id = dataclasses.replace(FULL, tokens_by_id=True)
    cfg = suite.Correctness()
    for ref, cand, want in (
        (by_id, by_id, True),
        (by_id, FULL, False),
        (FULL, by_id, False),
        (by_id, None, False),
    ):
        got = adapt_to(cfg, ref, "correctness", [], cand)
        assert got.tokens_by_id is want
        asked = ["return_tokens_as_token_ids" in r.extra for r in got.requests(0)]
        assert asked == [want] * cfg.probes_count
