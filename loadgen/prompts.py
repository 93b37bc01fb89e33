"""Synthetic prompts of a known length, built from a small built-in word list.

A prompt of ``prompt_tokens`` words is exactly ``prompt_tokens`` tokens on our sim engine, which
tokenizes on whitespace. On a real engine the word count is only an estimate of the token
count: English text averages about 1.3 tokens per word with common BPE tokenizers, and these
words were chosen short and common so that most are a single token. When the exact prompt
length matters on a real engine, read ``RequestRecord.prompt_tokens`` (from the server's usage
report) rather than trusting the requested length; re-tokenizing on the client with one
tokenizer for every model is a known way to get it wrong.

Prompts are random word sequences rather than one repeated text so that a prefix cache cannot
turn the benchmark into a cache benchmark, and they are seeded so every target and every rerun
gets the same text. The list is built in so that nothing is downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

_WORD_TEXT = """
    able about above act add after again age ago air all also always am an and animal answer
    any appear are area arm art as ask at away back ball bank base be bear beat bed been before
    began begin being bell best better between big bird black blue boat body bone book both box
    boy bring brown build built busy but buy by call came can car care carry case cat cause cell
    center change check child city class clean clear close cold color come common cook copy corn
    cost could count country course cover cross cry cut dark day deal dear deep did die differ
    do does dog done door down draw dream dress drink drive drop dry during each early earth
    east easy eat edge egg end enough even ever every eye face fact fall family far farm fast
    father feel feet few field fig fill final find fine fire first fish five floor fly follow
    food foot for force form found four free fresh friend from front full game garden gave get
    girl give glass go gold good got grass great green ground group grow had hair half hand
    happy hard has hat have he head hear heart heat help her here high hill him his hold home
    hope horse hot hour house how huge idea if in inch iron is it its job join just keep kept
    key kind king knew know lake land large last late laugh lay lead learn leave left leg less
    let letter life light like line list little live long look lost lot love low made main make
    man many map mark may me mean meet men might mile milk mind miss money moon more most mother
    move much must my name near need never new next nice night no noise north nose not note now
    number of off often oil old on once one only open or order other our out over own page paint
    paper park part pass past path pay people pick piece place plan plant play point poor power
    press pull push put quick quiet rain ran reach read ready real red rest rich ride right ring
    river road rock room root rose round run safe said sail salt same sand sat save saw say sea
    seat second see seed seem self sell send sent set seven shape share she ship shoe shop short
    show side sign silver simple sing sister sit six size skin sky sleep slow small snow so soft
    soil some son song soon sound south space speak speed spell spring square stand star start
    stay step still stone stop store story street strong such sugar summer sun sure table tail
    take talk tall team tell ten test than that the their them then there these they thin thing
    think this those three time tiny to today told too took top touch town tree true try turn
    two under unit until up us use very visit voice wait walk wall want warm was wash watch water
    wave way we wear week well went were west what wheel when where which while white who why
    wide wife wild will wind window winter wish with woman wood word work world would write
    yard year yes yet you young your
"""

WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())
"""Short, common English words; most are one BPE token."""

_WORD_ARRAY = np.asarray(WORDS)


def synthetic_prompts(n: int, prompt_tokens: int, *, seed: int = 0) -> list[str]:
    """``n`` distinct prompts of exactly ``prompt_tokens`` words, reproducible by ``seed``.

    Prompts are drawn one after another from one generator, so the first ``k`` prompts for a
    seed do not depend on ``n``: a longer run replays a shorter run's prompts and extends them.
    """
    check_synthetic_prompts(n, prompt_tokens, seed=seed)
    vocabulary = len(WORDS)
    rng = np.random.default_rng(seed)
    words = np.asarray(WORDS)
    seen: set[str] = set()
    prompts: list[str] = []
    while len(prompts) < n:
        prompt = " ".join(words[rng.integers(0, vocabulary, size=prompt_tokens)].tolist())
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts


def check_synthetic_prompts(n: int, prompt_tokens: int, *, seed: int = 0) -> None:
    """Raise what :func:`synthetic_prompts` would raise for these arguments, without drawing:
    a spec is validated without building its prompts."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: must be a non-negative integer, got {n!r}")
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens: must be an integer >= 1, got {prompt_tokens!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    vocabulary = len(WORDS)
    # Refuse requests that cannot be distinct, or that would make redraws dominate.
    if prompt_tokens * np.log(vocabulary) < np.log(max(2 * n, 1)):
        raise ValueError(
            f"n: {n} distinct prompts of {prompt_tokens} words need a longer prompt_tokens "
            f"(vocabulary is {vocabulary} words)"
        )


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """The single-turn chat form of a prompt, so both APIs are sent the same text."""
    return [{"role": "user", "content": prompt}]


# --------------------------------------------------------------------------- length distributions

LengthKind = Literal["fixed", "uniform", "normal", "lognormal"]
LENGTH_KINDS: tuple[LengthKind, ...] = ("fixed", "uniform", "normal", "lognormal")


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A distribution of lengths in tokens, always clipped to ``[minimum, maximum]``.

    ``mean`` is the fixed length, the centre of ``uniform`` (which spans ``mean +- spread``),
    the mean of ``normal`` (standard deviation ``spread``) and the mean of ``lognormal``
    (``spread`` is the sigma of the log, so the median is ``mean * exp(-spread^2 / 2)``).
    Real prompt and output lengths are right-skewed, which is what ``lognormal`` is for.
    """

    kind: LengthKind = "fixed"
    mean: float = 128.0
    spread: float = 0.0
    minimum: int = 1
    maximum: int = 1_000_000

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"kind: must be one of {', '.join(LENGTH_KINDS)}, got {self.kind!r}")
        if not (math.isfinite(self.mean) and self.mean >= 1):
            raise ValueError(f"mean: must be a finite number >= 1, got {self.mean!r}")
        if not (math.isfinite(self.spread) and self.spread >= 0):
            raise ValueError(f"spread: must be a finite number >= 0, got {self.spread!r}")
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(
                f"minimum/maximum: need 1 <= minimum <= maximum, got {self.minimum}, {self.maximum}"
            )

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """``"128"``, ``"fixed:128"``, ``"uniform:128:64"``, ``"lognormal:256:0.6"`` ..."""
        parts = text.split(":")
        try:
            if len(parts) == 1:
                return cls("fixed", float(parts[0]))
            kind = parts[0]
            numbers = [float(p) for p in parts[1:]]
        except ValueError:
            raise ValueError(f"not a length distribution: {text!r}") from None
        if kind not in LENGTH_KINDS or not 1 <= len(numbers) <= 2:
            raise ValueError(
                f"not a length distribution: {text!r} (use KIND:MEAN[:SPREAD], KIND one of "
                f"{', '.join(LENGTH_KINDS)})"
            )
        return cls(kind, numbers[0], numbers[1] if len(numbers) > 1 else 0.0)

    def sample(self, n: int, rng: np.random.Generator) -> list[int]:
        """``n`` integer lengths drawn from ``rng``."""
        if self.kind == "fixed" or self.spread == 0:
            values = np.full(n, self.mean)
        elif self.kind == "uniform":
            values = rng.uniform(self.mean - self.spread, self.mean + self.spread, size=n)
        elif self.kind == "normal":
            values = rng.normal(self.mean, self.spread, size=n)
        else:
            mu = math.log(self.mean) - self.spread**2 / 2
            values = rng.lognormal(mu, self.spread, size=n)
        clipped = np.clip(np.rint(values), self.minimum, self.maximum)
        return [int(v) for v in clipped.tolist()]


def sample_lengths(n: int, lengths: LengthDist, *, seed: int = 0) -> list[int]:
    """``n`` lengths, reproducible by ``seed``; the first ``k`` do not depend on ``n``."""
    _check_count_and_seed(n, seed)
    rng = np.random.default_rng([seed, 1])
    return lengths.sample(n, rng) if n else []


def varied_prompts(n: int, lengths: LengthDist, *, seed: int = 0) -> list[str]:
    """``n`` prompts whose word counts follow ``lengths``, reproducible by ``seed``.

    Words are built-in single-token words, so on the sim a length is exact; on a real engine
    fit them with :func:`loadgen.tokens.fit_prompts`. Prompts are not forced distinct (short
    fixed lengths could not be); the words are random, so collisions are rare beyond a few
    words.
    """
    counts = sample_lengths(n, lengths, seed=seed)
    rng = np.random.default_rng([seed, 2])
    return [_words(rng, k) for k in counts]


def shared_prefix_prompts(
    n: int,
    *,
    groups: int,
    prefix_tokens: int,
    suffix: LengthDist,
    seed: int = 0,
) -> list[str]:
    """Prompts in ``groups`` families sharing a ``prefix_tokens``-word prefix (a system prompt,
    a shared document), each with its own random suffix.

    Prompt ``i`` belongs to group ``i % groups``, so every group recurs throughout the run the
    way a prefix cache sees it in production, rather than in one block.
    """
    _check_count_and_seed(n, seed)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups: must be an integer >= 1, got {groups!r}")
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 1:
        raise ValueError(f"prefix_tokens: must be an integer >= 1, got {prefix_tokens!r}")
    rng = np.random.default_rng([seed, 3])
    prefixes = [_words(rng, prefix_tokens) for _ in range(groups)]
    tails = varied_prompts(n, suffix, seed=seed)
    return [f"{prefixes[i % groups]} {tails[i]}" for i in range(n)]


@dataclass(frozen=True, slots=True)
class Conversation:
    """A multi-turn chat: the user's turns in order, and reference answers where known.

    Only the user turns are sent; each follow-up is sent with the engine's own previous
    answers (see ``RequestSpec.parent``). ``answers`` (from a dataset) only size
    ``max_tokens``.
    """

    turns: tuple[str, ...]
    answers: tuple[str, ...] = ()


def synthetic_conversations(
    n: int, *, turns: int, lengths: LengthDist, seed: int = 0
) -> list[Conversation]:
    """``n`` conversations of ``turns`` user turns each, turn lengths from ``lengths``."""
    _check_count_and_seed(n, seed)
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise ValueError(f"turns: must be an integer >= 1, got {turns!r}")
    texts = varied_prompts(n * turns, lengths, seed=seed)
    return [Conversation(tuple(texts[i * turns : (i + 1) * turns])) for i in range(n)]


def _words(rng: np.random.Generator, k: int) -> str:
    return " ".join(_WORD_ARRAY[rng.integers(0, len(WORDS), size=k)].tolist())


def _check_count_and_seed(n: int, seed: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: must be a non-negative integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")


def word_lists(lengths: Sequence[int], *, seed: int = 0, slack: float = 2.0) -> list[list[str]]:
    """Seeded word sequences ``slack`` times longer than each length, for fitting a prompt to
    an engine's token count (:func:`loadgen.tokens.fit_prompts`) by taking a prefix."""
    rng = np.random.default_rng([seed, 4])
    return [
        _WORD_ARRAY[rng.integers(0, len(WORDS), size=math.ceil(n * slack) + 4)].tolist()
        for n in lengths
    ]
