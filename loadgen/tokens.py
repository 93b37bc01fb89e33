"""Prompt lengths in the engine's own tokens, not ours.

A prompt of "512 tokens" means 512 of the served model's tokens; any tokenizer on the client
would be the wrong one for most models (llmperf's mistake), and re-tokenizing inflates counts
(inference-perf #564). So we ask the engine: vLLM and our sim answer ``POST /tokenize``
(``{"model", "prompt"}`` -> ``{"count", ...}``). Prompts are then fitted to their target
length by taking more or fewer words from a seeded word sequence, in a few calls each.

Where an engine has no ``/tokenize`` we fall back to a documented estimate
(:func:`estimate_tokens`): one token per word of our built-in word list (its words were chosen
to be single BPE tokens) and, for other text, about four characters per token, the common
rule of thumb for English with BPE vocabularies. The caller learns which was used
(``TokenCounter.source``), so a report can say how exact its prompt lengths are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import httpx

from loadgen.client import Target, read_capped
from loadgen.prompts import WORDS

# A /tokenize answer lists one id per token of a prompt we sent (at most the prompt cap): more
# than this is an engine that answers with something else, and is not read.
TOKENIZE_BODY_BYTES = 4 << 20

CountSource = Literal["engine", "estimate"]
_WORD_SET = frozenset(WORDS)
_MAX_FIT_CALLS = 12


def estimate_tokens(text: str) -> int:
    """Tokens in ``text`` without a tokenizer: exact on the sim, a rough figure elsewhere."""
    words = text.split()
    if all(w in _WORD_SET for w in words):
        return len(words)
    return max(len(words), math.ceil(len(text) / 4))


def tokenize_url(target: Target) -> str:
    """vLLM serves ``/tokenize`` at the root, not under ``/v1``."""
    base = target.base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    parts = urlsplit(base)
    return f"{parts.scheme}://{parts.netloc}{parts.path}/tokenize"


@dataclass(slots=True)
class TokenCounter:
    """Counts tokens with the engine's ``/tokenize`` when it has one, else estimates."""

    target: Target
    client: httpx.AsyncClient
    source: CountSource = "estimate"
    calls: int = 0

    @classmethod
    async def connect(cls, target: Target, client: httpx.AsyncClient) -> TokenCounter:
        """Probe the engine once; any failure means "no tokenizer endpoint": estimate."""
        counter = cls(target, client)
        if await counter._engine_count("hello world") is not None:
            counter.source = "engine"
        return counter

    async def count(self, text: str) -> int:
        if self.source == "engine":
            n = await self._engine_count(text)
            if n is not None:
                return n
        return estimate_tokens(text)

    async def _engine_count(self, text: str) -> int | None:
        self.calls += 1
        try:
            async with self.client.stream(
                "POST",
                tokenize_url(self.target),
                json={"model": self.target.model, "prompt": text},
                timeout=self.target.timeout_s,
            ) as response:
                if response.status_code != 200:
                    return None
                body, over = await read_capped(response, TOKENIZE_BODY_BYTES)
            data = None if over else json.loads(body)
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(data, dict):
            return None
        count = data.get("count")
        if isinstance(count, int) and not isinstance(count, bool):
            return count
        tokens = data.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None


async def fit_prompt(words: Sequence[str], tokens: int, counter: TokenCounter) -> tuple[str, int]:
    """The longest prefix of ``words`` whose count is at most ``tokens``, and its count.

    Starts from a guess of one token per word and corrects by the observed ratio (secant
    steps), then bisects; with the sim or a word-per-token vocabulary the first call fits.
    ``words`` must be long enough; pass about twice the target to be safe.
    """
    if tokens < 1:
        raise ValueError(f"tokens: must be >= 1, got {tokens}")
    lo, lo_count = 0, 0  # largest prefix known to fit
    hi = len(words) + 1  # smallest prefix known not to fit
    guess = min(tokens, len(words))
    for _ in range(_MAX_FIT_CALLS):
        if guess <= lo or guess >= hi:
            guess = (lo + hi) // 2
            if guess <= lo:
                break
        n = await counter.count(" ".join(words[:guess]))
        if n == tokens:
            return " ".join(words[:guess]), n
        if n < tokens:
            lo, lo_count = guess, n
            guess = guess + max(1, round((tokens - n) * guess / max(n, 1)))
        else:
            hi = guess
            guess = guess - max(1, round((n - tokens) * guess / max(n, 1)))
    if lo == 0:
        return words[0], await counter.count(words[0])
    return " ".join(words[:lo]), lo_count


async def fit_prompts(
    word_lists: Sequence[Sequence[str]], lengths: Sequence[int], counter: TokenCounter
) -> tuple[list[str], list[int]]:
    """Fit each word list to its length in engine tokens; returns prompts and their counts."""
    prompts: list[str] = []
    counts: list[int] = []
    for words, n in zip(word_lists, lengths, strict=True):
        prompt, count = await fit_prompt(words, n, counter)
        prompts.append(prompt)
        counts.append(count)
    return prompts, counts
