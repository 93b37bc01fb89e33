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
  argmax is that same greedy token.
* The top token's lead over the runner-up is what decides whether perturbed numerics change
  the text, so it is shaped like a real model's: at most positions the model is confident
  (a lead of at least ``TOP1_MARGIN`` nats), at a fraction ``TIE_RATE`` it is a near-tie (a
  lead below ``TIE_MAX_LEAD``). Benign numeric noise can then flip only those near-ties, as
  a bf16-vs-fp32 or batch-order difference does on a real model, while a real bug flips
  confident positions too.

Candidate variants (``Numerics``), each a stand-in for a real failure mode:

* ``noise_sigma``: Gaussian noise added to every logit. Models benign numeric differences
  (another kernel, reduction order, batch-size-dependent GEMM tiling, fp8 KV cache): the
  distribution moves a little, greedy text diverges only where the top two were nearly tied,
  and teacher-forced logprobs stay close to the reference's.
* ``bug_rate``: at a seeded fraction of positions the logits of the top token and of a token
  ranked at least ``BUG_MIN_RANK`` and ``BUG_MIN_GAP`` nats below it are swapped. Models a
  systematic bug (a wrong RoPE scaling, a broken quantised kernel, a bad tokenizer/template
  or sampler change): confident positions pick a token the reference model finds unlikely,
  which teacher-forced scoring shows as large logprob drops.
* NaN logprobs (``--nan-after-requests``) are applied by the server, not here: a NaN in the
  logits poisons the whole row, so the engine reports NaN for every logprob of a request.
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
TIE_RATE = 0.08
TIE_MAX_LEAD = 1.0
TIE_MIN_LEAD = 1e-3
BUG_MIN_RANK = 5
BUG_MIN_GAP = 3.0
# Noise of sigma cannot flip a lead above this many sigmas (the largest of ~4k Gaussian
# differences stays far below it), so greedy skips building logits there.
NOISE_SAFE_SIGMAS = 12.0
EOS_PENALTY = 6.0
DEFAULT_EOS_RATE = 1.0 / 512.0
LOGPROB_FLOOR = -9999.0
_NOISE_BUDGET = 1 << 19  # table entries per noise table (4 MiB of float64)
_MAX_NOISE_ROWS = 128

_MASK64 = (1 << 64) - 1
_TIE_SALT = 0x7E1E5
_NOISE_SALT = 0x9015E
_BUG_SALT = 0xB06B06
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


@dataclass(frozen=True, slots=True)
class PromptTokenLogprobs:
    """Teacher-forced score of one prompt token: its logprob and rank, and the top-n."""

    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Numerics:
    """How a candidate's numerics differ from the reference model (all zero: identical).

    ``seed`` picks which positions the bug hits and which noise is drawn, so two candidates
    with different seeds are wrong in different places.
    """

    noise_sigma: float = 0.0
    bug_rate: float = 0.0
    seed: int = 0

    @property
    def exact(self) -> bool:
        return self.noise_sigma <= 0.0 and self.bug_rate <= 0.0


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
        numerics: Numerics = Numerics(),
    ) -> None:
        if vocab_size < 2:
            raise ValueError("vocab_size must be >= 2")
        self.vocab_size = vocab_size
        self.seed = seed
        self.context_size = context_size
        self.numerics = numerics
        self._exact = numerics.exact
        self._seed_hash = _mix64(seed & _MASK64)
        self._eos_threshold = int(eos_rate * (1 << 24))
        self._tie_threshold = int(TIE_RATE * (1 << 24))
        self._variant_hash = _mix64((numerics.seed & _MASK64) ^ 0xCA4D1DA7E)
        self._bug_threshold = int(min(1.0, max(0.0, numerics.bug_rate)) * (1 << 53))
        self._noise_safe_lead = NOISE_SAFE_SIGMAS * numerics.noise_sigma
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

    def _tie_lead(self, h: int) -> float | None:
        """The top token's lead at a near-tie position, None where the model is confident."""
        t = _mix64(h ^ _TIE_SALT)
        if (t >> 40) >= self._tie_threshold:
            return None
        return TIE_MIN_LEAD + (t & 0xFFFFFF) / float(1 << 24) * (TIE_MAX_LEAD - TIE_MIN_LEAD)

    def _bug_hit(self, h: int) -> bool:
        return (_mix64(h ^ self._variant_hash ^ _BUG_SALT) >> 11) < self._bug_threshold

    def greedy(self, context: Sequence[int], *, allow_eos: bool = True) -> int:
        """Argmax of ``logits(context, allow_eos=allow_eos)``, without building it if it can."""
        h = self._context_hash(context)
        top, eos_first = self._top_and_eos(h)
        if not self._exact and self._may_differ(h, eos_first and allow_eos):
            return int(np.argmax(self._logits_from_hash(h, allow_eos)))
        return EOS_TOKEN_ID if (eos_first and allow_eos) else top

    def _may_differ(self, h: int, eos_leads: bool) -> bool:
        """Whether the variant could change the argmax at this position."""
        if self._bug_threshold and self._bug_hit(h):
            return True
        if self._noise_safe_lead <= 0.0:
            return False
        lead = None if eos_leads else self._tie_lead(h)
        return (TOP1_MARGIN if lead is None else lead) < self._noise_safe_lead

    def _base_logits(self, h: int) -> FloatArray:
        top, eos_first = self._top_and_eos(h)
        a = _mix64(h ^ 0x5EED) % self._rows
        b = _mix64(h ^ 0xB0B) % self._rows
        z: FloatArray = self._noise[0, a] + self._noise[1, b]
        z[EOS_TOKEN_ID] -= EOS_PENALTY
        saved = float(z[top])
        z[top] = -np.inf
        runner_up = float(z.max())
        lead = self._tie_lead(h)
        if lead is None:
            bonus = ((h >> 24) & 0xFFFF) / 65536.0
            z[top] = max(saved, runner_up + TOP1_MARGIN + bonus)
        else:
            z[top] = runner_up + lead
        if eos_first:
            z[EOS_TOKEN_ID] = z[top] + TOP1_MARGIN
        return z

    def _logits_from_hash(self, h: int, allow_eos: bool) -> FloatArray:
        z = self._base_logits(h)
        if not allow_eos:
            z[EOS_TOKEN_ID] = -np.inf
        if self._exact:
            return z
        if self._bug_threshold and self._bug_hit(h):
            self._apply_bug(z, h)
        sigma = self.numerics.noise_sigma
        if sigma > 0.0:
            rng = np.random.default_rng(_mix64(h ^ self._variant_hash ^ _NOISE_SALT))
            z += rng.standard_normal(self.vocab_size) * sigma
        return z

    @staticmethod
    def _apply_bug(z: FloatArray, h: int) -> None:
        """Swap the top logit with one ranked >= BUG_MIN_RANK and >= BUG_MIN_GAP nats below."""
        order = np.argsort(-z, kind="stable")
        best = int(order[0])
        limit = float(z[best]) - BUG_MIN_GAP
        candidates = [
            int(i)
            for i in order[BUG_MIN_RANK - 1 : BUG_MIN_RANK + 63]
            if z[i] <= limit and np.isfinite(z[i]) and i != EOS_TOKEN_ID
        ]
        if not candidates:
            tail = order[BUG_MIN_RANK - 1 :]
            candidates = [int(i) for i in tail if z[i] <= limit and np.isfinite(z[i])][:8]
        if not candidates:
            return
        victim = candidates[_mix64(h ^ 0xF00D) % min(8, len(candidates))]
        z[best], z[victim] = z[victim], z[best]

    def logits(self, context: Sequence[int], *, allow_eos: bool = True) -> FloatArray:
        """Raw logits; with ``allow_eos=False`` EOS is masked, as the sampler would see them."""
        return self._logits_from_hash(self._context_hash(context), allow_eos)

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
        return TokenLogprobs(token_id, _clamp(float(lp[token_id])), _top(lp, top_n))

    def score(self, context: Sequence[int], token_id: int, top_n: int) -> PromptTokenLogprobs:
        """Teacher-forced score of ``token_id`` after ``context`` (EOS allowed, no sampler).

        The rank counts strictly better tokens, so ties share the better rank, as vLLM's
        prompt-logprob ranks do.
        """
        lp = self.logprobs(context)
        value = float(lp[token_id])
        rank = 1 + int(np.count_nonzero(lp > value))
        return PromptTokenLogprobs(token_id, _clamp(value), rank, _top(lp, top_n))

    def prompt_logprobs(
        self, prompt: Sequence[int], top_n: int, start: int = 1, stop: int | None = None
    ) -> list[PromptTokenLogprobs]:
        """Scores of ``prompt[start:stop]``, each given the tokens before it.

        Sliced so a server can score a long prompt in pieces without blocking its event loop.
        """
        end = len(prompt) if stop is None else min(stop, len(prompt))
        keep = self.context_size
        return [
            self.score(prompt[max(0, i - keep) : i], prompt[i], top_n)
            for i in range(max(1, start), end)
        ]


def _top(lp: FloatArray, top_n: int) -> tuple[tuple[int, float], ...]:
    n = min(top_n, lp.shape[0])
    if n <= 0:
        return ()
    idx = np.argpartition(-lp, n - 1)[:n]
    # Ties broken by id so the listing is reproducible.
    order = sorted(idx.tolist(), key=lambda i: (-lp[i], i))
    return tuple((i, _clamp(float(lp[i]))) for i in order)


def _clamp(logprob: float) -> float:
    # JSON has no -inf; OpenAI-compatible servers report a floor instead.
    return max(logprob, LOGPROB_FLOOR)
