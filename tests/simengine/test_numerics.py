"""Candidate numerics over HTTP: teacher-forced scoring with prompt_logprobs, and NaN logprobs.

The pure properties of the variants (noise flips only near-ties, the bug flips at large
margins) are in test_model.py; here the same variants are seen through vLLM's wire format, the
way a correctness check would score a candidate against the reference's output.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from simengine.launch import SimHandle, SimPool

FAST = ("--profile", "tiny")
GREEDY = {"temperature": 0, "ignore_eos": True}
PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def sims(module_launcher: SimPool) -> dict[str, SimHandle]:
    return {
        "reference": module_launcher.start(*FAST),
        "noise": module_launcher.start(*FAST, "--logit-noise", "0.05", "--seed", "1"),
        "bug": module_launcher.start(*FAST, "--numeric-bug", "0.2", "--seed", "1"),
    }


def _score(sim: SimHandle, prompt: str | list[int], k: int = 2) -> list[Any]:
    body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": k, **GREEDY}
    resp = httpx.post(sim.url + "/v1/completions", json=body, timeout=10)
    assert resp.status_code == 200, resp.text
    scores: list[Any] = resp.json()["choices"][0]["prompt_logprobs"]
    return scores


def test_prompt_logprobs_shape(sims: dict[str, SimHandle]) -> None:
    ref = sims["reference"]
    ids = httpx.post(ref.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    scores = _score(ref, PROMPT, 3)
    assert len(scores) == len(ids)
    assert scores[0] is None
    for token_id, entry in zip(ids[1:], scores[1:], strict=True):
        keys = list(entry)
        assert keys[0] == str(token_id)  # the actual token first, then the top-k
        assert 3 <= len(entry) <= 4
        for key, value in entry.items():
            assert set(value) == {"logprob", "rank", "decoded_token"}
            assert value["logprob"] <= 0.0
            assert isinstance(value["rank"], int) and value["rank"] >= 1
            assert value["decoded_token"].strip()
            assert int(key) >= 0
        tops = sorted(v["rank"] for k, v in entry.items() if k != str(token_id) or len(entry) == 3)
        assert tops[:3] == [1, 2, 3]

    chat = httpx.post(
        ref.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
              "prompt_logprobs": 0, **GREEDY},
    ).json()  # fmt: skip
    assert chat["prompt_logprobs"][0] is None
    assert all(len(e) == 1 for e in chat["prompt_logprobs"][1:])
    assert "prompt_logprobs" not in chat["choices"][0]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt_logprobs": 21}, "greater than max allowed"),
        ({"prompt_logprobs": -2}, "positive value or -1"),
        ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
    ],
)
def test_prompt_logprobs_errors(
    sims: dict[str, SimHandle], fields: dict[str, Any], message: str
) -> None:
    resp = httpx.post(sims["reference"].url + "/v1/completions", json={"prompt": "x", **fields})
    assert resp.status_code == 400
    assert message in resp.json()["error"]["message"]
    assert resp.json()["error"]["param"] == "prompt_logprobs"


def _reference_continuation(ref: SimHandle, n: int) -> list[int]:
    body = {"prompt": PROMPT, "max_tokens": n, "return_token_ids": True, **GREEDY}
    resp = httpx.post(ref.url + "/v1/completions", json=body, timeout=10).json()
    choice = resp["choices"][0]
    return list(choice["prompt_token_ids"]) + list(choice["token_ids"])


def test_teacher_forced_scoring_separates_noise_from_a_bug(sims: dict[str, SimHandle]) -> None:
    tokens = _reference_continuation(sims["reference"], 120)
    start = len(tokens) - 120

    def actual(sim: SimHandle) -> tuple[list[float], list[int]]:
        scores = _score(sim, tokens, 0)
        entries = [scores[i][str(tokens[i])] for i in range(start, len(tokens))]
        return [float(e["logprob"]) for e in entries], [int(e["rank"]) for e in entries]

    (ref, ref_ranks), (noise, _), (bug, _) = (
        actual(sims[k]) for k in ("reference", "noise", "bug")
    )
    # Greedy output is the reference's own top token (but where EOS leads: ignore_eos masked
    # it while generating, scoring does not).
    assert sum(r == 1 for r in ref_ranks) >= 115
    noise_drift = [abs(a - b) for a, b in zip(ref, noise, strict=True)]
    bug_drop = [a - b for a, b in zip(ref, bug, strict=True)]
    assert max(noise_drift) < 0.5  # benign: every position stays close
    assert sum(d > 3.0 for d in bug_drop) >= 10  # a bug: confident positions fall far
    assert sum(d > 3.0 for d in noise_drift) == 0


def test_nan_logprobs_after_n_requests(launcher: SimPool) -> None:
    sim = launcher.start(*FAST, "--nan-after-requests", "1")
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        body = {"prompt": "a b", "max_tokens": 3, "logprobs": 2, **GREEDY}
        first = client.post("/v1/completions", json=body).json()
        assert all(math.isfinite(v) for v in first["choices"][0]["logprobs"]["token_logprobs"])

        # Streams carry NaN as null, as vLLM's pydantic chunks do.
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            lines = [line for line in resp.iter_lines() if line.startswith("data: {")]
        assert len(lines) == 3
        for line in lines:
            assert '"token_logprobs":[null]' in line
        chat = {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2,
            "logprobs": True,
            "top_logprobs": 1,
            "stream": True,
            **GREEDY,
        }
        with client.stream("POST", "/v1/chat/completions", json=chat) as resp:
            content = [line for line in resp.iter_lines() if '"content":[' in line]
        assert content and all('"logprob":null' in line for line in content)

        # A JSON body cannot hold NaN: vLLM's non-streaming response fails with a 500.
        failed = client.post("/v1/completions", json=body)
        assert failed.status_code == 500
        scored = client.post(
            "/v1/completions", json={"prompt": "a b", "max_tokens": 1, "prompt_logprobs": 1}
        )
        assert scored.status_code == 500
        # Without logprobs nothing shows: the text is unchanged.
        plain = client.post("/v1/completions", json={"prompt": "a b", "max_tokens": 3, **GREEDY})
        assert plain.status_code == 200
        assert plain.json()["choices"][0]["text"] == first["choices"][0]["text"]
