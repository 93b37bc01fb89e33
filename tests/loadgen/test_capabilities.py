"""`loadgen.capabilities.discover` against engines that have or lack each feature: the real sim
process (started, never imported: see conftest.py) with `--max-logprobs` and `--without`, and
llama.cpp's captured answers replayed byte for byte (tests/support/capture_replay.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
from capture_replay import replay

from loadgen.capabilities import FEATURES, Capabilities, discover
from loadgen.client import Target

Sim = Callable[..., contextlib.AbstractContextManager[str]]


def ask(url: str) -> Capabilities:
    return asyncio.run(discover(Target("engine", url, timeout_s=10.0, deadline_s=30.0)))


def named(problems: tuple[str, ...]) -> set[str]:
    """The features the problems name ("logprobs 20: ..." names logprobs)."""
    return {p.split(":", 1)[0].split(" ", 1)[0] for p in problems}


@pytest.mark.parametrize(
    ("flags", "lacking", "top_max"),
    [
        ((), set(), 20),
        (("--without", "chat"), {"chat"}, 20),
        (("--without", "logprobs"), {"logprobs"}, None),
        (("--without", "prompt_logprobs"), {"prompt_logprobs"}, 20),
        (("--without", "token_ids"), {"token_ids", "prompt_token_ids"}, 20),
        (("--without", "stream_usage"), {"stream_usage"}, 20),
        # vLLM's limit covers prompt logprobs too; token ids, asked apart, stay
        (("--max-logprobs", "0"), {"logprobs", "prompt_logprobs"}, None),
        (
            ("--without", "token_ids,stream_usage", "--max-logprobs", "1"),
            {"token_ids", "prompt_token_ids", "stream_usage"},
            1,
        ),
    ],
    ids=[
        "defaults",
        "without chat",
        "without logprobs",
        "without prompt_logprobs",
        "without token_ids",
        "without stream_usage",
        "max-logprobs 0",
        "without two, max-logprobs 1",
    ],
)
def test_each_lacking_feature_is_found_and_only_it(
    sim: Sim, flags: tuple[str, ...], lacking: set[str], top_max: int | None
) -> None:
    with sim(*flags) as url:
        caps = ask(url)
    assert {f: caps.has(f) for f in FEATURES} == {f: f not in lacking for f in FEATURES}
    assert caps.top_logprobs_max == top_max
    # every lacking feature is named, and nothing else (but the top-k sizes tried in vain)
    tried = {"logprobs"} if top_max not in (None, 20) else set()
    assert named(caps.problems) == lacking | tried, caps.problems
    assert caps.to_dict()["problems"] == list(caps.problems)


def test_the_largest_top_k_under_the_limit_is_found(sim: Sim) -> None:
    with sim("--max-logprobs", "5") as url:
        caps = ask(url)
    assert caps.top_logprobs_max == 5
    assert all(caps.has(f) for f in FEATURES)
    (problem,) = caps.problems  # 20 was refused with vLLM's message; 5 was served
    assert problem.startswith("logprobs 20: HTTP 400: ")
    assert "Requested sample logprobs of 20, which is greater than max allowed: 5" in problem


def test_the_problems_say_what_the_engine_answered(sim: Sim) -> None:
    with sim("--without", "chat", "--max-logprobs", "0") as url:
        caps = ask(url)
    by_feature = {p.split(":", 1)[0]: p for p in caps.problems}
    assert "default chat template is no longer allowed" in by_feature["chat"]
    assert "HTTP 400" in by_feature["chat"]
    refused = "logprobs of {}, which is greater than max allowed: 0"
    for k in (20, 5, 1):
        assert "sample " + refused.format(k) in by_feature[f"logprobs {k}"]
    assert "prompt " + refused.format(1) in by_feature["prompt_logprobs"]
    assert caps.token_ids and caps.prompt_token_ids and caps.completions and caps.stream_usage


# --------------------------------------------------------------------------- llama.cpp's bytes
# Each replay answers every request with one capture: what that one answer implies.


def test_llamacpp_ignoring_prompt_logprobs_and_return_token_ids() -> None:
    async def main() -> Capabilities:
        async with replay("llamacpp-completions-prompt-logprobs.http") as url:
            return await discover(Target("llamacpp", url, timeout_s=5.0))

    caps = asyncio.run(main())
    assert caps.completions
    # `prompt_logprobs: 1` asked, a 200 without them: no prompt logprobs, no token ids either
    assert not caps.prompt_logprobs and not caps.token_ids and not caps.prompt_token_ids
    assert not caps.logprobs and caps.top_logprobs_max is None  # its `logprobs: null`
    problems = {p.split(":", 1)[0]: p for p in caps.problems}
    assert problems["prompt_logprobs"] == "prompt_logprobs: the answer has no prompt_logprobs"
    assert problems["token_ids"].startswith("token_ids: no token_ids in the answer")
    assert "prompt_token_ids" in problems


def test_llamacpp_logprob_entries_carry_the_token_ids() -> None:
    async def main() -> Capabilities:
        async with replay("llamacpp-completions-logprobs.http") as url:
            return await discover(Target("llamacpp", url, timeout_s=5.0))

    caps = asyncio.run(main())
    # chat-style entries with their own `id`: token ids without `token_ids`
    assert caps.logprobs and caps.token_ids
    assert not caps.prompt_token_ids and not caps.prompt_logprobs
    # the capture answers 3 alternatives whatever is asked: 20 and 5 fall short, 1 is served
    assert caps.top_logprobs_max == 1
    assert "logprobs 20: asked for 20 top logprobs, got 3" in caps.problems
    assert "logprobs 5: asked for 5 top logprobs, got 3" in caps.problems


def test_llamacpp_stream_usage_in_its_last_chunk() -> None:
    async def main() -> Capabilities:
        async with replay("llamacpp-completions-stream-logprobs.http") as url:
            return await discover(Target("llamacpp", url, timeout_s=5.0))

    caps = asyncio.run(main())
    # usage rides on the chunk with finish_reason, not a choices-less one: still usage
    assert caps.stream_usage
    # the same event stream to a request that asked for one JSON answer is not an answer
    assert not caps.completions
    assert any(p.startswith("completions: HTTP 200 but not JSON") for p in caps.problems)
