"""Numerical divergence between engines: benign nondeterminism passes, bugs hold.

References:
    vLLM, tests/models/utils.py (check_logprobs_close: at the first mismatch each token must be
    in the other's top-N); SGLang, python/sglang/test/runners.py (top-5 logprobs within 5e-2).
    H. He and Thinking Machines Lab, "Defeating Nondeterminism in LLM Inference", 2025 (kernels
    are not batch-invariant, so greedy outputs diverge under load without any bug).
    H. B. Mann and D. R. Whitney, "On a test of whether one of two random variables is
    stochastically larger than the other", Annals of Mathematical Statistics 18(1), 1947.

Why an envelope: the same greedy prompt diverges under load on the reference itself (reduction
order changes with batch size), so "identical outputs" holds every healthy candidate, and a
fixed logprob threshold is right for one model and wrong for the next. The gate therefore also
runs the reference against itself (alone and under load) and gives both sets of pairs here:
every threshold comes from that envelope, so what the reference does to itself passes.

Per prompt (statistics.md, "A protocol that separates benign noise from bugs"):
    teacher-forced: both engines score the reference's greedy continuation; per position
        |delta logp| of the reference's token, top-1 agreement, top-k overlap, and a coarse KL
        over the reference's top-k tokens that both engines list plus one "other" bucket
        (a coarsening of the true KL, so never larger than it);
    free-run greedy: exact match, the first position where the tokens differ, and the
        reference's margin there, m = logp_ref(top1) - logp_ref(candidate token). With logit
        noise sigma, P(flip | m) ~ Phi(-m / (sqrt(2) sigma)): benign flips happen at near-ties.

Checks (group correctness):
    hard rules, no alpha: a NaN or infinite logprob, an empty output where the reference has
        tokens, a runaway output (longer than max_tokens, or than runaway_factor x the
        reference's + 16 tokens), and a greedy flip to a token outside the reference's top-k
        (vLLM's rule; it stays a bug unless the envelope has such flips too);
    tests, the correctness budget split over five: flips at a margin above flip_margin_nat
        against the envelope's (one-sided Fisher exact test; with a hundred prompts a correct
        but noisier kernel makes one now and then, a bug makes many), the per-prompt mean
        |delta logp| and top-1 disagreement of candidate pairs against the envelope's scaled by
        s = 1 + envelope_tolerance plus a floor of benign numerics (floor_nat, floor_top1), the
        coarse KL against the envelope's scaled by s^2 plus floor_nat^2 / 2 (a KL grows with the
        square of the logit noise: a per-position difference d gives a KL of about d^2 / 2), and
        the first divergence position against the envelope's divided by s (more noise flips
        earlier; a flip at a near-tie, margin <= tie_nat, counts as none). The floors are what
        lets a deterministic reference, whose envelope is exactly zero, continue a kernel that
        rounds differently (policy.py says where each number comes from).
        One-sided Mann-Whitney for these four: valid for any distributions when the candidate
        is no noisier than the scaled envelope, and sensitive to a bug that touches only some
        prompts. These are evaluated once, on the whole set, so a fixed-sample test is the
        right tool.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import comb
from scipy.stats import fisher_exact, mannwhitneyu

from gate.analysis.checks import compared, statistic_check
from gate.analysis.policy import DivergencePolicy, Policy
from gate.analysis.types import Check, Decision
from gate.core.vocabulary import Role

__all__ = [
    "DivergenceSamples",
    "GreedyPair",
    "GreedyRun",
    "GreedyStats",
    "Scored",
    "TeacherForcedPair",
    "TeacherStats",
    "Token",
    "divergence_checks",
    "envelope_early_share",
    "greedy_stats",
    "teacher_stats",
]

Token = int | str
"""A token as the engines report it: its id when they return ids (vLLM's return_token_ids),
else its text. One gate uses one kind for every sequence and top-k map, so they compare."""

_RUNAWAY_SLACK_TOKENS = 16
_TESTS = 5


@dataclass(frozen=True)
class Scored:
    """One engine's scores of a token sequence: per position the logprob of the sequence's
    token and the engine's top-k {token id: logprob}."""

    logprobs: Sequence[float]
    top: Sequence[Mapping[Token, float]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        object.__setattr__(self, "top", tuple(dict(t) for t in self.top))
        if len(self.top) != len(self.logprobs):
            raise ValueError(f"{len(self.logprobs)} logprobs but {len(self.top)} top-k entries")

    def finite(self) -> bool:
        return all(math.isfinite(x) for x in self.logprobs) and all(
            math.isfinite(v) for t in self.top for v in t.values()
        )


@dataclass(frozen=True)
class TeacherForcedPair:
    """The reference's greedy continuation of one prompt, scored by two engines (a: the
    reference; b: the candidate, or the reference again for the envelope)."""

    token_ids: Sequence[Token]
    a: Scored
    b: Scored

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        n = len(self.token_ids)
        if len(self.a.logprobs) != n or len(self.b.logprobs) != n:
            raise ValueError("both engines must score every token of the continuation")


@dataclass(frozen=True)
class GreedyRun:
    """One engine's free-running greedy output for one prompt."""

    token_ids: Sequence[Token]
    logprobs: Sequence[float]
    top: Sequence[Mapping[Token, float]]
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        object.__setattr__(self, "top", tuple(dict(t) for t in self.top))
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.top) != n:
            raise ValueError("token_ids, logprobs and top need one entry per generated token")

    def finite(self) -> bool:
        return all(math.isfinite(x) for x in self.logprobs) and all(
            math.isfinite(v) for t in self.top for v in t.values()
        )


@dataclass(frozen=True)
class GreedyPair:
    """The same prompt run greedily on two engines (a: the reference)."""

    a: GreedyRun
    b: GreedyRun


@dataclass(frozen=True)
class DivergenceSamples:
    """Candidate pairs (reference vs candidate) and envelope pairs (reference vs itself, alone
    and under load), teacher-forced and free-run, one entry per prompt."""

    teacher: Sequence[TeacherForcedPair] = field(default_factory=tuple)
    greedy: Sequence[GreedyPair] = field(default_factory=tuple)
    envelope_teacher: Sequence[TeacherForcedPair] = field(default_factory=tuple)
    envelope_greedy: Sequence[GreedyPair] = field(default_factory=tuple)
    failures: Sequence[tuple[Role, str]] = field(default_factory=tuple)
    """(engine, what went wrong) per probe an engine did not answer usably (an HTTP error,
    a body without logprobs): such a prompt has no pair above. A candidate failure on a
    prompt the reference answered is a hard fail (vLLM answers a NaN logprob with a 500);
    a reference failure leaves the prompt uncompared, which is a lack of evidence."""


@dataclass(frozen=True)
class TeacherStats:
    mean_abs_dlogp: float
    max_abs_dlogp: float
    top1_disagree: float
    topk_overlap: float
    kl: float
    finite: bool


@dataclass(frozen=True)
class GreedyStats:
    exact: bool
    first_divergence: int | None
    length: int
    margin: float | None
    outside_top_k: bool
    empty: bool
    runaway: bool
    finite: bool


def _top_arrays(
    top: Sequence[Mapping[Token, float]], k: int, vocab: dict[Token, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Each position's k most likely (token, logprob), best first, tokens numbered through
    `vocab` (shared by both engines of a pair), padded with -1 and logprob -inf where an engine
    listed fewer."""
    width = max((len(t) for t in top), default=0)
    width = max(width, k)
    ids = np.full((len(top), width), -1, dtype=np.int64)
    lps = np.full((len(top), width), -np.inf, dtype=np.float64)
    for i, t in enumerate(top):
        if t:
            ids[i, : len(t)] = [vocab.setdefault(tok, len(vocab)) for tok in t]
            lps[i, : len(t)] = list(t.values())
    order = np.argsort(-lps, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(ids, order, axis=1), np.take_along_axis(lps, order, axis=1)


def teacher_stats(pair: TeacherForcedPair, k: int) -> TeacherStats:
    """Per-prompt statistics of a teacher-forced pair (module docstring).

    The coarse KL at a position uses the tokens of the reference's top-k that the other engine
    lists too, each as its own bucket, plus one bucket for everything else; it is a coarsening
    of the true KL, so it never exceeds it.
    """
    finite = pair.a.finite() and pair.b.finite()
    n = len(pair.token_ids)
    if n == 0:
        return TeacherStats(0.0, 0.0, 0.0, 1.0, 0.0, finite)
    if not finite:
        return TeacherStats(math.inf, math.inf, 1.0, 0.0, math.inf, False)
    delta = np.abs(np.array(pair.a.logprobs) - np.array(pair.b.logprobs))
    vocab: dict[Token, int] = {}
    ids_a, lp_a = _top_arrays(pair.a.top, k, vocab)
    ids_b, lp_b = _top_arrays(pair.b.top, k, vocab)
    listed_a = ids_a >= 0
    listed_b = ids_b >= 0
    top1 = np.mean(ids_a[:, 0] != ids_b[:, 0])
    match = (ids_a[:, :, None] == ids_b[:, None, :]) & listed_a[:, :, None] & listed_b[:, None, :]
    overlap = match.any(axis=2).sum(axis=1) / np.maximum(listed_a.sum(axis=1), 1)
    common = match.any(axis=2)
    lp_b_on_a = np.where(match, lp_b[:, None, :], -np.inf).max(axis=2)
    p_a = np.where(common, np.exp(lp_a), 0.0)
    p_b = np.where(common, np.exp(lp_b_on_a), 0.0)
    other_a = np.maximum(1.0 - p_a.sum(axis=1), 1e-12)
    other_b = np.maximum(1.0 - p_b.sum(axis=1), 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(
            common, p_a * (np.log(np.maximum(p_a, 1e-12)) - np.log(np.maximum(p_b, 1e-12))), 0.0
        )
    kl = np.maximum(terms.sum(axis=1) + other_a * np.log(other_a / other_b), 0.0)
    return TeacherStats(
        mean_abs_dlogp=float(delta.mean()),
        max_abs_dlogp=float(delta.max()),
        top1_disagree=float(top1),
        topk_overlap=float(overlap.mean()),
        kl=float(kl.mean()),
        finite=True,
    )


def greedy_stats(pair: GreedyPair, k: int, runaway_factor: float) -> GreedyStats:
    """Per-prompt statistics of a free-run greedy pair (module docstring)."""
    a, b = pair.a, pair.b
    finite = a.finite() and b.finite()
    la, lb = len(a.token_ids), len(b.token_ids)
    limit = runaway_factor * la + _RUNAWAY_SLACK_TOKENS
    runaway = lb > limit or (b.max_tokens is not None and lb > b.max_tokens)
    empty = lb == 0 and la > 0
    common = min(la, lb)
    first: int | None = None
    for j in range(common):
        if a.token_ids[j] != b.token_ids[j]:
            first = j
            break
    if first is None and la != lb:
        first = common
    margin: float | None = None
    outside = False
    if first is not None and first < common:
        top = dict(sorted(a.top[first].items(), key=lambda kv: -kv[1])[:k])
        chosen = b.token_ids[first]
        best = max(top.values()) if top else math.nan
        if chosen in top:
            margin = float(best - top[chosen])
        elif len(a.top[first]) >= k:
            outside = True
        # else: the reference listed fewer than k (an engine capped below top_k), so whether
        # the candidate's token is in its top-k is unknown: neither a margin nor a flip
    return GreedyStats(
        exact=first is None,
        first_divergence=first,
        length=la,
        margin=margin,
        outside_top_k=outside,
        empty=empty,
        runaway=runaway,
        finite=finite,
    )


def _check(
    cid: str,
    decision: Decision,
    message: str,
    reference: float | None = None,
    candidate: float | None = None,
    threshold: float | None = None,
    samples: tuple[int, int] = (0, 0),
    alpha: float | None = None,
) -> Check:
    check = statistic_check(
        f"correctness.{cid}",
        "correctness",
        cid,
        decision,
        message,
        **compared(reference, candidate),
        threshold=threshold,
        samples=samples,
        alpha=alpha,
    )
    # Undecided is a lack of evidence (the reference failed a probe, too few prompts for the
    # budget, no budget at all), never a finding against the candidate: only a failure holds.
    return dataclasses.replace(check, required=False) if decision == "undecided" else check


def _answered_check(failures: Sequence[tuple[str, str]], compared: int) -> Check | None:
    """Requests an engine failed: a hard fail for the candidate, inconclusive for the
    reference (see DivergenceSamples.failures); None when every one was answered."""
    cand = [m for role, m in failures if role == "candidate"]
    ref = [m for role, m in failures if role == "reference"]
    if not cand and not ref:
        return None
    if cand:
        return _check(
            "answered",
            "fail",
            f"The candidate failed {len(cand)} correctness request(s) (greedy probes or "
            f"teacher-forced scoring) that the reference answered (first: {cand[0][:200]}); an "
            "engine that cannot return its logprobs is held.",
            reference=float(len(ref)),
            candidate=float(len(cand)),
            threshold=0.0,
            samples=(compared, compared),
        )
    return _check(
        "answered",
        "undecided",
        f"The reference failed {len(ref)} correctness request(s) (first: {ref[0][:200]}), so "
        "those prompts could not be compared.",
        reference=float(len(ref)),
        threshold=0.0,
        samples=(compared, compared),
    )


def _hard_checks(
    teach: Sequence[TeacherStats],
    greedy: Sequence[GreedyStats],
    env_greedy: Sequence[GreedyStats],
    policy: Policy,
    n_prompts: int,
) -> list[Check]:
    dp = policy.divergence
    checks: list[Check] = []
    bad = sum(not s.finite for s in teach) + sum(not s.finite for s in greedy)
    checks.append(
        _check(
            "finite",
            "fail" if bad else "pass",
            (
                f"{bad} prompt score(s) had a NaN or infinite logprob: a numerical bug."
                if bad
                else f"Every logprob of {n_prompts} prompts was finite."
            ),
            candidate=float(bad),
            threshold=0.0,
            samples=(n_prompts, n_prompts),
        )
    )
    if greedy:
        empty = sum(s.empty for s in greedy)
        runaway = sum(s.runaway for s in greedy)
        checks.append(
            _check(
                "empty",
                "fail" if empty else "pass",
                (
                    f"The candidate returned no tokens for {empty} of {len(greedy)} prompts the "
                    "reference answered."
                    if empty
                    else f"The candidate answered all {len(greedy)} greedy prompts."
                ),
                candidate=float(empty),
                threshold=0.0,
                samples=(len(greedy), len(greedy)),
            )
        )
        checks.append(
            _check(
                "length",
                "fail" if runaway else "pass",
                (
                    f"The candidate ran away on {runaway} of {len(greedy)} prompts (longer than "
                    f"max_tokens or {dp.runaway_factor:g}x the reference + "
                    f"{_RUNAWAY_SLACK_TOKENS} tokens)."
                    if runaway
                    else f"No runaway generation in {len(greedy)} greedy prompts."
                ),
                candidate=float(runaway),
                threshold=0.0,
                samples=(len(greedy), len(greedy)),
            )
        )
        checks.append(_flips_check(greedy, env_greedy, dp))
    return checks


def _flips_check(
    greedy: Sequence[GreedyStats], env_greedy: Sequence[GreedyStats], dp: DivergencePolicy
) -> Check:
    """Greedy flips outside the reference's top-k: a failure unless the reference flips so
    against itself too."""
    env_outside = sum(s.outside_top_k for s in env_greedy)
    outside = sum(s.outside_top_k for s in greedy)
    exact = sum(s.exact for s in greedy)
    rate = f"{exact} of {len(greedy)} greedy outputs match exactly"
    if outside and not env_outside:
        decision: Decision = "fail"
        message = (
            f"{outside} greedy output(s) flipped to a token outside the reference's "
            f"top-{dp.top_k}, which no logit noise explains ({rate})."
        )
    elif outside:
        decision = "pass"
        message = (
            f"{outside} greedy output(s) flipped outside the reference's top-{dp.top_k}, but "
            f"the reference does so against itself too ({env_outside}); left to the margin "
            f"test ({rate})."
        )
    else:
        decision = "pass"
        message = f"Every greedy flip stayed within the reference's top-{dp.top_k} ({rate})."
    return _check(
        "greedy.flips",
        decision,
        message,
        reference=float(env_outside),
        candidate=float(outside),
        threshold=0.0,
        samples=(len(env_greedy), len(greedy)),
    )


def _margin_check(
    greedy: Sequence[GreedyStats],
    env_greedy: Sequence[GreedyStats],
    policy: Policy,
    alpha: float | None,
) -> Check:
    """Large-margin flips, candidate vs envelope: one-sided Fisher exact test.

    A flip where the reference preferred its token by more than flip_margin_nat is what a bug
    does, but across a hundred prompts a noisy-but-correct kernel makes one now and then, so
    the count is compared with the envelope's (whose flips are counted from
    flip_margin_nat / (1 + envelope_tolerance), since a noise larger by that factor flips at
    margins larger by it). Without an envelope there is nothing to compare with, and any such
    flip holds (the rule of statistics.md).
    """
    dp = policy.divergence
    limit = dp.flip_margin_nat
    env_limit = limit / (1.0 + dp.envelope_tolerance)

    def big(stats: Sequence[GreedyStats], at: float) -> int:
        return sum(s.margin is not None and s.margin > at for s in stats)

    b_c, b_e = big(greedy, limit), big(env_greedy, env_limit)
    worst = max((s.margin or 0.0 for s in greedy), default=0.0)
    samples = (len(env_greedy), len(greedy))
    told = (
        f"{b_c} of {len(greedy)} greedy outputs first flipped where the reference preferred its "
        f"token by more than {limit:.2f} nat (largest {worst:.2f}), vs {b_e} of "
        f"{len(env_greedy)} above {env_limit:.2f} nat for the reference against itself"
    )
    if not env_greedy:
        return _check(
            "greedy.margin",
            "fail" if b_c else "pass",
            f"{told}; without an envelope any such flip is a bug."
            if b_c
            else f"{told}: no flip beyond a near-tie.",
            candidate=float(b_c),
            threshold=limit,
            samples=samples,
        )
    if alpha is None:
        return _check(
            "greedy.margin",
            "undecided",
            f"{told}; alpha_split gives correctness no budget, so it is not tested.",
            float(b_e),
            float(b_c),
            limit,
            samples,
        )
    table = [[b_c, len(greedy) - b_c], [b_e, len(env_greedy) - b_e]]
    p = float(fisher_exact(table, alternative="greater").pvalue)
    failed = p <= alpha
    verdict = "more than noise explains" if failed else "as the reference's own noise does"
    return _check(
        "greedy.margin",
        "fail" if failed else "pass",
        f"{told}; p={p:.2g} (alpha {alpha:.2g}): {verdict}.",
        float(b_e),
        float(b_c),
        limit,
        samples,
        alpha,
    )


def _min_pvalue(n: int, m: int) -> float:
    return float(1.0 / comb(n + m, n, exact=False)) if n and m else 1.0


def _mw_check(
    cid: str,
    what: str,
    cand: np.ndarray,
    env_scaled: np.ndarray,
    env_raw: np.ndarray,
    alpha: float | None,
    higher_is_worse: bool,
    unit: str,
) -> Check:
    samples = (int(env_raw.size), int(cand.size))
    if env_raw.size == 0:
        return _check(
            cid,
            "undecided",
            f"{what}: no envelope (reference against itself) was given, so there is no "
            "threshold to compare with.",
            samples=samples,
        )
    med_c = float(np.median(cand)) if cand.size else math.nan
    med_e = float(np.median(env_raw))
    told = (
        f"{what}: median {med_c:.3g}{unit} for the candidate vs {med_e:.3g}{unit} for the "
        "reference against itself"
    )
    if alpha is None:
        return _check(
            cid,
            "undecided",
            f"{told}; alpha_split gives correctness no budget, so it is not tested.",
            med_e,
            med_c,
            samples=samples,
        )
    if _min_pvalue(cand.size, env_raw.size) > alpha:
        return _check(
            cid,
            "undecided",
            f"{told}; too few prompts ({cand.size} and {env_raw.size}) to reach alpha "
            f"{alpha:.2g} with a rank test.",
            med_e,
            med_c,
            samples=samples,
            alpha=alpha,
        )
    alternative = "greater" if higher_is_worse else "less"
    p = float(mannwhitneyu(cand, env_scaled, alternative=alternative).pvalue)
    failed = p <= alpha
    verdict = (
        "noisier than the reference's own envelope allows"
        if failed
        else "within the reference's own envelope"
    )
    return _check(
        cid,
        "fail" if failed else "pass",
        f"{told}; p={p:.2g} (alpha {alpha:.2g}): {verdict}.",
        med_e,
        med_c,
        samples=samples,
        alpha=alpha,
    )


def divergence_checks(data: DivergenceSamples, policy: Policy, notes: list[str]) -> list[Check]:
    """Hard rules, then the five envelope tests (module docstring)."""
    dp = policy.divergence
    k = dp.top_k
    teach = [teacher_stats(p, k) for p in data.teacher]
    env_teach = [teacher_stats(p, k) for p in data.envelope_teacher]
    greedy = [greedy_stats(p, k, dp.runaway_factor) for p in data.greedy]
    env_greedy = [greedy_stats(p, k, dp.runaway_factor) for p in data.envelope_greedy]
    answered = _answered_check(data.failures, max(len(teach), len(greedy)))
    if not teach and not greedy:
        return [answered] if answered is not None else []
    n_prompts = max(len(teach), len(greedy))
    checks = _hard_checks(teach, greedy, env_greedy, policy, n_prompts)
    if answered is not None:
        checks.insert(0, answered)
    env_bad = sum(not s.finite for s in env_teach) + sum(not s.finite for s in env_greedy)
    if env_bad:
        notes.append(
            f"The reference's own envelope has {env_bad} non-finite score(s): its thresholds "
            "are unreliable."
        )
    budget = policy.group_alpha("correctness")
    alpha = budget / _TESTS if budget > 0.0 else None
    scale = 1.0 + dp.envelope_tolerance
    ok_teach = [s for s in teach if s.finite]
    ok_env = [s for s in env_teach if s.finite]
    if teach:

        def arr(stats: Sequence[TeacherStats], name: str) -> np.ndarray:
            return np.array([getattr(s, name) for s in stats], dtype=np.float64)

        for cid, name, factor, floor, what, unit in (
            (
                "teacher.logprob",
                "mean_abs_dlogp",
                scale,
                dp.floor_nat,
                "Mean |delta logprob|",
                " nat",
            ),
            ("teacher.top1", "top1_disagree", scale, dp.floor_top1, "Top-1 disagreement", ""),
            ("teacher.kl", "kl", scale**2, dp.floor_nat**2 / 2.0, "Coarse top-k KL", " nat"),
        ):
            env = arr(ok_env, name)
            checks.append(
                _mw_check(
                    cid,
                    f"{what} per prompt (teacher-forced)",
                    arr(ok_teach, name),
                    factor * env + floor,
                    env,
                    alpha,
                    True,
                    unit,
                )
            )
    if greedy:
        checks.append(_margin_check(greedy, env_greedy, policy, alpha))

        def position(s: GreedyStats) -> float:
            # A near-tie flip is benign numerics wherever it happens (policy tie_nat).
            tie = s.margin is not None and s.margin <= dp.tie_nat
            return float(s.length if s.first_divergence is None or tie else s.first_divergence)

        cand_pos = np.array([position(s) for s in greedy], dtype=np.float64)
        env_pos = np.array([position(s) for s in env_greedy], dtype=np.float64)
        checks.append(
            _mw_check(
                "greedy.position",
                "First greedy divergence position",
                cand_pos,
                env_pos / scale,
                env_pos,
                alpha,
                False,
                "",
            )
        )
    return checks


def envelope_early_counts(data: DivergenceSamples | None, policy: Policy) -> tuple[int, int]:
    """(pairs that part before `early_tokens`, pairs) of the reference's free-run pairs against
    itself (alone vs under load)."""
    if data is None:
        return 0, 0
    dp = policy.divergence
    early = 0
    for pair in data.envelope_greedy:
        st = greedy_stats(pair, dp.top_k, dp.runaway_factor)
        length = min(len(pair.a.token_ids), len(pair.b.token_ids)) or st.length
        cut = min(dp.early_tokens, max(length, 1))
        early += st.first_divergence is not None and st.first_divergence < cut
    return early, len(data.envelope_greedy)


def envelope_early_share(data: DivergenceSamples | None, policy: Policy) -> float | None:
    """The share of the reference's free-run pairs against itself (alone vs under load) that
    part before `early_tokens`: the reference's own behaviour the mirrored load outputs are
    held to (outputs.py). None without an envelope."""
    early, pairs = envelope_early_counts(data, policy)
    return early / pairs if pairs else None
