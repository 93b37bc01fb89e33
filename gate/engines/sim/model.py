"""A toy tokenizer and language model: deterministic, cheap, and honest about its logprobs.

The gate compares two engines by what they emit, so the sim needs outputs that are
reproducible across processes (greedy decoding of a prompt always gives the same text) and
logprobs that are real probabilities (log-softmax of actual logits) so that statistics computed
on them behave as they would on a real model.

Design choices:

* One whitespace-separated word is one token. Words in the vocabulary map to their index so
  that re-tokenising generated text gives back exactly the generated ids; any other word maps
  to a stable CRC32 hash, so arbitrary prompts tokenise identically in every process.
* The next-token distribution depends only on the model seed and the last
  ``CONTEXT_SIZE`` token ids. The greedy choice comes from a 64-bit hash of that context in
  pure Python, so the common path (greedy, no logprobs) never touches numpy. The full logit
  vector is only built when logprobs or sampling need it, and it is constructed so that its
  argmax is that same greedy token, with a margin of at least ``TOP1_MARGIN`` nats: a
  candidate engine with slightly perturbed numerics would still decode the same text.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

EOS_TOKEN_ID = 0
EOS_TOKEN_STR = "</s>"
CONTEXT_SIZE = 3
LOGIT_SIGMA = 2.0
TOP1_MARGIN = 3.0
EOS_PENALTY = 6.0
DEFAULT_EOS_RATE = 1.0 / 512.0
LOGPROB_FLOOR = -9999.0
_NOISE_BUDGET = 1 << 19  # table entries per noise table (4 MiB of float64)
_MAX_NOISE_ROWS = 128

_MASK64 = (1 << 64) - 1
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_CODAS = ("", "", "", "n", "r", "s", "l")
_VOCAB_SEED = "gate-sim-vocabulary-v1"

FloatArray = npt.NDArray[np.float64]


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-mixed 64-bit hash step in pure Python."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def build_vocabulary(size: int) -> tuple[str, ...]:
    """Pronounceable, unique words; index 0 is the EOS marker.

    The vocabulary is fixed (it does not depend on the model seed) so that every engine,
    whatever its weights, tokenises prompts identically and reports the same prompt counts.
    """
    if size < 2:
        raise ValueError("vocabulary needs at least EOS and one word")
    rng = random.Random(_VOCAB_SEED)
    words: list[str] = [EOS_TOKEN_STR]
    seen = {EOS_TOKEN_STR}
    while len(words) < size:
        syllables = rng.choice((1, 2, 2, 2, 3, 3, 4))
        word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))
        word += rng.choice(_CODAS)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


class ToyTokenizer:
    """Whitespace tokenizer over a generated vocabulary."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = EOS_TOKEN_ID
        self.vocabulary = build_vocabulary(vocab_size)
        self._ids = {word: i for i, word in enumerate(self.vocabulary) if i != EOS_TOKEN_ID}
        # Output text of each id: a leading space keeps concatenated outputs word-separated.
        self._texts = tuple(
            "" if i == EOS_TOKEN_ID else " " + w for i, w in enumerate(self.vocabulary)
        )
        # Display form in logprobs, where EOS must still be visible.
        self._strs = tuple(
            EOS_TOKEN_STR if i == EOS_TOKEN_ID else t for i, t in enumerate(self._texts)
        )

    def token_id(self, word: str) -> int:
        known = self._ids.get(word)
        if known is not None:
            return known
        # Never EOS: text cannot end a sequence by accident.
        return 1 + zlib.crc32(word.encode("utf-8", "surrogatepass")) % (self.vocab_size - 1)

    def encode(self, text: str) -> list[int]:
        return [self.token_id(word) for word in text.split()]

    def count(self, text: str) -> int:
        return len(text.split())

    def token_text(self, token_id: int) -> str:
        """Text a token contributes to the output (empty for EOS, as with skipped specials)."""
        return self._texts[token_id]

    def token_str(self, token_id: int) -> str:
        """How a token is shown in logprobs."""
        return self._strs[token_id]

    def decode(self, token_ids: Sequence[int]) -> str:
        texts = self._texts
        return "".join(texts[i] for i in token_ids)

    def is_valid_id(self, token_id: int) -> bool:
        return 0 <= token_id < self.vocab_size


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """A fixed toy chat template: role markers are single tokens, then the generation prompt."""
    parts = [f"<|{role}|> {content}" for role, content in messages]
    parts.append("<|assistant|>")
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Logprob of the chosen token and the best ``top_n`` alternatives, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class ToyModel:
    """Next-token distributions as a pure function of (seed, last few token ids).

    The background of each logit vector is the sum of two rows picked by the context hash
    from small noise tables built once at load time: drawing 4096 fresh normals per token cost
    ~100 us, which would cap sampled streams at a few thousand tokens per second per core.
    """

    def __init__(
        self,
        vocab_size: int,
        seed: int = 0,
        *,
        context_size: int = CONTEXT_SIZE,
        eos_rate: float = DEFAULT_EOS_RATE,
    ) -> None:
        if vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        self.vocab_size = vocab_size
        self.seed = seed
        self.context_size = context_size
        self._seed_hash = _mix64(seed & _MASK64)
        self._eos_threshold = int(eos_rate * (1 << 24))
        rows = max(4, min(_MAX_NOISE_ROWS, _NOISE_BUDGET // vocab_size))
        rng = np.random.Generator(np.random.PCG64(self._seed_hash))
        # Two independent tables; the sum of one row from each has standard deviation sigma.
        noise = rng.standard_normal((2, rows, vocab_size)) * (LOGIT_SIGMA / math.sqrt(2.0))
        noise.flags.writeable = False
        self._noise = noise
        self._rows = rows

    def _context_hash(self, context: Sequence[int]) -> int:
        h = self._seed_hash
        start = max(0, len(context) - self.context_size)
        for i in range(start, len(context)):
            h = _mix64(h ^ context[i])
        return h

    def _top_and_eos(self, h: int) -> tuple[int, bool]:
        top = 1 + h % (self.vocab_size - 1)
        eos_first = (h >> 40) < self._eos_threshold
        return top, eos_first

    def greedy(self, context: Sequence[int], *, allow_eos: bool = True) -> int:
        """Argmax of ``logits(context, allow_eos=allow_eos)`` without building the vector."""
        top, eos_first = self._top_and_eos(self._context_hash(context))
        return EOS_TOKEN_ID if (eos_first and allow_eos) else top

    def _base_logits(self, h: int) -> FloatArray:
        top, eos_first = self._top_and_eos(h)
        a = _mix64(h ^ 0x5EED) % self._rows
        b = _mix64(h ^ 0xB0B) % self._rows
        z: FloatArray = self._noise[0, a] + self._noise[1, b]
        z[EOS_TOKEN_ID] -= EOS_PENALTY
        saved = float(z[top])
        z[top] = -np.inf
        runner_up = float(z.max())
        bonus = ((h >> 24) & 0xFFFF) / 65536.0
        z[top] = max(saved, runner_up + TOP1_MARGIN + bonus)
        if eos_first:
            z[EOS_TOKEN_ID] = z[top] + TOP1_MARGIN
        return z

    def logits(self, context: Sequence[int], *, allow_eos: bool = True) -> FloatArray:
        """Raw logits; with ``allow_eos=False`` EOS is masked, as the sampler would see them."""
        z = self._base_logits(self._context_hash(context))
        if not allow_eos:
            z[EOS_TOKEN_ID] = -np.inf
        return z

    def logprobs(self, context: Sequence[int], *, allow_eos: bool = True) -> FloatArray:
        z = self.logits(context, allow_eos=allow_eos)
        m = float(z.max())
        return z - (m + float(np.log(np.exp(z - m).sum())))

    def next_token(
        self,
        context: Sequence[int],
        *,
        temperature: float,
        rng: np.random.Generator | None,
        allow_eos: bool = True,
    ) -> int:
        """Greedy at temperature 0, otherwise one draw from softmax(logits / temperature)."""
        if temperature <= 0.0 or rng is None:
            return self.greedy(context, allow_eos=allow_eos)
        z = self.logits(context, allow_eos=allow_eos) / temperature
        p = np.exp(z - z.max())
        cdf = np.cumsum(p)
        u = rng.random() * float(cdf[-1])
        return min(int(np.searchsorted(cdf, u, side="right")), self.vocab_size - 1)

    def describe(
        self, context: Sequence[int], token_id: int, top_n: int, *, allow_eos: bool = True
    ) -> TokenLogprobs:
        """Logprob of ``token_id`` and the ``top_n`` most likely tokens at this position."""
        lp = self.logprobs(context, allow_eos=allow_eos)
        top: tuple[tuple[int, float], ...] = ()
        n = min(top_n, self.vocab_size)
        if n > 0:
            idx = np.argpartition(-lp, n - 1)[:n]
            # Ties broken by id so the listing is reproducible.
            order = sorted(idx.tolist(), key=lambda i: (-lp[i], i))
            top = tuple((i, _clamp(float(lp[i]))) for i in order)
        return TokenLogprobs(token_id, _clamp(float(lp[token_id])), top)


def _clamp(logprob: float) -> float:
    # JSON has no -inf; OpenAI-compatible servers report a floor instead.
    return max(logprob, LOGPROB_FLOOR)
