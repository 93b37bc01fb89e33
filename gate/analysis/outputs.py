"""The mirrored outputs of a load scenario at temperature 0: does the candidate say what the
reference says, to the same prompt at the same instant?

Every load scenario is a divergence test the gate gets for free: the same greedy request went to
both engines, so their outputs can be compared pair by pair (token ids where both engines sent
them, else text), with no probe of our own and on whatever engine it is. What the comparison can
say is limited, and the check says no more:
    benign numerics make greedy outputs part at near-ties, and late: kernels that are not
        batch-invariant move logits by ~1e-3 to 1e-2 nat, which flips a token only where the top
        two are that close (He and Thinking Machines Lab, "Defeating Nondeterminism in LLM
        Inference", 2025: 1,000 greedy completions of one prompt on one engine gave 80 distinct
        texts, all identical for the first 102 tokens);
    a numerical bug (a broken kernel, a wrong quantization, a flipped layer) changes the tokens
        from the first few positions on, in most prompts.
So the check counts the pairs that part within the first `early_tokens` tokens (of the shorter
output, when shorter) and holds only when that share is gross: above `gross_share`, or the
reference's own early share against itself (from the correctness stage, scaled like every
envelope by 1 + envelope_tolerance) when that is larger. A hard rule with its own small error
rate `gross_alpha`, so it holds a grossly divergent candidate even where the correctness stage is
switched off.

Requests of a load scenario are not independent: a batch shares its kernels' path, so pairs part
in runs. The test is therefore on blocks of consecutive requests, `MIN_BLOCK` (16) at least and
at most `BLOCKS` (32) of them: the block shares are bounded in [0, 1], and blocks longer than the
runs are nearly independent however the pairs inside one depend on each other, so Hoeffding's
inequality bounds the chance that their mean exceeds the threshold by t at exp(-2 B t^2)
(W. Hoeffding, "Probability inequalities for sums of bounded random variables", JASA 58, 1963).
The assumption, stated: pairs depend on each other over runs shorter than a block (16 requests,
or n/32 from 512 on). It needs 14 blocks (224 pairs) to reach 0.001 at all; with fewer the check
is inconclusive. A binomial test on the pairs would not be valid where they part in runs
(tests/gate/analysis/test_outputs.py shows it passing its alpha by far there). The
finer judgement (margins, teacher-forced logprobs against the envelope) is the correctness
stage's (divergence.py).

A text comparison places the first differing character at a token position by the reference's
characters per token (the position is an estimate then, and the check says which basis it used).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gate.analysis.checks import statistic_check
from gate.analysis.policy import Policy
from gate.analysis.types import Check, Decision

__all__ = [
    "BLOCKS",
    "HISTOGRAM_BINS",
    "MIN_BLOCK",
    "MirroredOutputs",
    "Output",
    "OutputExample",
    "block_counts",
    "common_prefix",
    "compare_outputs",
    "first_divergence",
    "gross_threshold",
    "hoeffding_p",
    "is_prefix",
    "mirrored_output_checks",
]

HISTOGRAM_BINS = 64
BLOCKS = 32
MIN_BLOCK = 16
"""First-divergence positions 0..63 counted one by one; the last bin counts 64 and beyond."""
_EXAMPLES = 3
_EXAMPLE_CHARS = 240

Basis = Literal["token_ids", "text"]


@dataclass(frozen=True)
class Output:
    """One engine's answer to one request: its token ids when it sent them, its text, and the
    number of output tokens counted."""

    text: str
    tokens: int
    token_ids: Sequence[int] | None = None


@dataclass(frozen=True)
class OutputExample:
    """A pair that parted: the request, where, and both outputs from a little before it."""

    request_id: int
    position: int
    reference: str
    candidate: str


@dataclass(frozen=True)
class MirroredOutputs:
    """One scenario's comparison: `compared` pairs both engines answered with output, `exact`
    of them identical, `early` parted before `early_tokens`; `histogram[i]` counts the pairs
    whose first divergence is at token i (the last bin: at HISTOGRAM_BINS - 1 or later);
    `blocks`: (pairs, early) per block of consecutive compared requests (module docstring)."""

    scenario: str
    compared: int
    exact: int
    early: int
    early_tokens: int
    basis: Basis
    histogram: Sequence[int] = field(default_factory=tuple)
    examples: Sequence[OutputExample] = field(default_factory=tuple)
    blocks: Sequence[tuple[int, int]] = field(default_factory=tuple)

    @property
    def diverged(self) -> int:
        return self.compared - self.exact

    @property
    def match_rate(self) -> float:
        return self.exact / self.compared if self.compared else math.nan

    def median_position(self) -> float | None:
        """The median first-divergence position of the pairs that parted (None: none did)."""
        n = sum(self.histogram)
        if n == 0:
            return None
        seen = 0
        for i, count in enumerate(self.histogram):
            seen += count
            if 2 * seen >= n:
                return float(i)
        return float(len(self.histogram) - 1)


def common_prefix(x: Sequence[object] | str, y: Sequence[object] | str) -> int:
    """The length of the longest common prefix, by bisection on slice comparisons (done in C),
    so long outputs that part late cost O(n log n) machine work, not a Python loop per item."""
    lo, hi = 0, min(len(x), len(y))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if x[:mid] == y[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def is_prefix(a: Output, b: Output) -> bool:
    """One output is the other's beginning (an earlier stop, a truncation): they part only
    where the shorter ends, which says nothing about its tokens."""
    if a.token_ids is not None and b.token_ids is not None:
        n = common_prefix(a.token_ids, b.token_ids)
        return n == min(len(a.token_ids), len(b.token_ids))
    return common_prefix(a.text, b.text) == min(len(a.text), len(b.text))


def first_divergence(a: Output, b: Output) -> tuple[int | None, Basis]:
    """The token position where `b` first differs from the reference `a` (None: identical),
    and the basis it was found on: token ids where both have them, else text."""
    if a.token_ids is not None and b.token_ids is not None:
        ia, ib = list(a.token_ids), list(b.token_ids)
        if ia == ib:
            return None, "token_ids"
        return common_prefix(ia, ib), "token_ids"
    ta, tb = a.text, b.text
    if ta == tb:
        return None, "text"
    c = common_prefix(ta, tb)
    per_char = a.tokens / len(ta) if ta else 0.0
    position = int(c * per_char)
    return (min(position, max(a.tokens - 1, 0)) if a.tokens else 0), "text"


def _example(rid: int, position: int, a: Output, b: Output) -> OutputExample:
    # The text from a little before the first differing character, so both sides show it.
    ta, tb = a.text, b.text
    c = common_prefix(ta, tb)
    start = max(0, c - 40)
    return OutputExample(
        request_id=rid,
        position=position,
        reference=ta[start : start + _EXAMPLE_CHARS],
        candidate=tb[start : start + _EXAMPLE_CHARS],
    )


def compare_outputs(
    scenario: str,
    reference: Mapping[int, Output],
    candidate: Mapping[int, Output],
    early_tokens: int,
) -> MirroredOutputs:
    """Every request both engines answered with output, compared (module docstring). The
    basis is token ids only when every compared pair had them on both sides."""
    hist = [0] * HISTOGRAM_BINS
    compared = exact = early = 0
    bases: set[Basis] = set()
    examples: list[OutputExample] = []
    flags: list[bool] = []
    for rid in sorted(reference.keys() & candidate.keys()):
        a, b = reference[rid], candidate[rid]
        if not (a.text or a.token_ids) or not (b.text or b.token_ids):
            continue  # an empty output is the errors' and outputs' checks' business
        compared += 1
        at, basis = first_divergence(a, b)
        bases.add(basis)
        if at is None:
            exact += 1
            flags.append(False)
            continue
        hist[min(at, HISTOGRAM_BINS - 1)] += 1
        length = min(a.tokens, b.tokens) or max(a.tokens, b.tokens)
        # a prefix parts where the shorter ends, never early on either basis
        flags.append(at < min(early_tokens, max(length, 1)) and not is_prefix(a, b))
        early += flags[-1]
        if len(examples) < _EXAMPLES:
            examples.append(_example(rid, at, a, b))
    return MirroredOutputs(
        scenario=scenario,
        compared=compared,
        exact=exact,
        early=early,
        early_tokens=early_tokens,
        basis="text" if "text" in bases or not bases else "token_ids",
        histogram=tuple(hist),
        examples=tuple(examples),
        blocks=block_counts(flags),
    )


def block_counts(
    flags: Sequence[bool], blocks: int = BLOCKS, min_block: int = MIN_BLOCK
) -> tuple[tuple[int, int], ...]:
    """(pairs, early) per block of consecutive flags: blocks of max(min_block, n / blocks)
    flags (the remainder joins the last one); one block when there are fewer flags."""
    n = len(flags)
    if n == 0:
        return ()
    size = max(min_block, math.ceil(n / blocks))
    b = max(1, n // size)
    out = []
    for j in range(b):
        lo, hi = j * size, (n if j == b - 1 else (j + 1) * size)
        out.append((hi - lo, sum(flags[lo:hi])))
    return tuple(out)


def hoeffding_p(blocks: Sequence[tuple[int, int]], threshold: float) -> float:
    """The one-sided Hoeffding bound on P(mean block share >= observed) when every block's
    expected share is at most `threshold`: exp(-2 B t^2), 1 when the mean is not above it."""
    shares = [e / n for n, e in blocks if n]
    if not shares:
        return 1.0
    t = sum(shares) / len(shares) - threshold
    return 1.0 if t <= 0 else math.exp(-2.0 * len(shares) * t * t)


def gross_threshold(policy: Policy, envelope_share: float | None) -> float:
    """The early share the check tolerates: the policy's floor, or the reference's own early
    share against itself scaled by 1 + envelope_tolerance when that is larger (capped at 0.95,
    so a check remains)."""
    dp = policy.divergence
    own = 0.0 if envelope_share is None else envelope_share * (1.0 + dp.envelope_tolerance)
    return min(0.95, max(dp.gross_share, own))


def mirrored_output_checks(
    outputs: Sequence[MirroredOutputs], policy: Policy, envelope_share: float | None = None
) -> list[Check]:
    """One check per scenario compared (module docstring); `envelope_share`: the share of the
    correctness stage's envelope pairs (the reference against itself) that part early."""
    dp = policy.divergence
    p0 = gross_threshold(policy, envelope_share)
    checks: list[Check] = []
    for o in outputs:
        basis = "token ids" if o.basis == "token_ids" else "text (positions estimated)"
        median = o.median_position()
        where = f", the median first divergence at token {median:.0f}" if median is not None else ""
        told = (
            f"{o.exact} of {o.compared} mirrored greedy outputs in {o.scenario} match exactly"
            f"{where}; {o.early} parted before token {o.early_tokens} (compared by {basis})"
        )
        decision: Decision
        if hoeffding_p([(1, 1)] * len(o.blocks), p0) > dp.gross_alpha:
            decision = "undecided"
            message = (
                f"{told}: {len(o.blocks)} block(s) of consecutive requests, too few to reach "
                f"alpha {dp.gross_alpha:g} even if every pair parted early (about "
                f"{MIN_BLOCK * 14} pairs are needed at the defaults)."
            )
            p = None
        else:
            p = hoeffding_p(o.blocks, p0)
            failed = p <= dp.gross_alpha
            decision = "fail" if failed else "pass"
            share = o.early / o.compared
            message = (
                f"{told}: an early share of {share:.0%} against at most {p0:.0%} that benign "
                f"numerics explain; p<={p:.2g} over {len(o.blocks)} blocks of consecutive "
                f"requests (alpha {dp.gross_alpha:g}): "
                + (
                    "the candidate's outputs differ from the first tokens on, which no "
                    "nondeterminism explains."
                    if failed
                    else "no gross divergence."
                )
            )
        checks.append(
            replace(
                statistic_check(
                    f"{o.scenario}.outputs.divergence",
                    "correctness",
                    "divergence",
                    decision,
                    message,
                    scenario=o.scenario,
                    reference=envelope_share,
                    candidate=o.early / o.compared if o.compared else None,
                    threshold=p0,
                    samples=(o.compared, o.compared),
                    alpha=dp.gross_alpha if p is not None else None,
                ),
                # Too few blocks is a lack of evidence for a hard rule, not a reason to hold.
                required=False,
            )
        )
    return checks
