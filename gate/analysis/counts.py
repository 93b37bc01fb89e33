"""One-sided sequential test that the candidate produces more errors than the reference.

References:
    M. Lindon and A. Malek, "Anytime-valid inference for multinomial count data", NeurIPS 2022
    (code: assuncaolfi/savvi, michaellindon/anycount).
    M. Lindon, C. Sanden and V. Shirikian, "Rapid regression detection in software deployments
    through sequential testing", KDD 2022.
    J. Ville, "Etude critique de la notion de collectif", 1939.
    V. Vovk and R. Wang, "E-values: calibration, combination and applications", Annals of
    Statistics 49(3), 2021 (an average of test martingales is a test martingale).

Why a count process test: errors are rare and arrive one at a time; the gate wants to hold as
soon as the candidate's share of them is implausible, without paying for looking after every
event. Conditional on an error occurring, its arm label is Bernoulli(theta) with theta = rho
under the null, rho being the candidate's share of the traffic (0.5 for mirrored load), whatever
the (unknown, time-varying) base error rate is.

The paper's two-sided Bayes factor uses a Dirichlet(k rho) mixture over theta. A gate only cares
about "the candidate has more errors", so this module restricts the mixture to theta > rho:

    BF_n = E_{theta ~ Beta(k rho, k (1 - rho)) | theta > rho} [ L_n(theta) / L_n(rho) ]
         = B(a_c + x_c, a_r + x_r) / B(a_c, a_r)
           * P(Beta(a_c + x_c, a_r + x_r) > rho) / P(Beta(a_c, a_r) > rho)
           / (rho^x_c (1 - rho)^x_r),

with a_c = k rho, a_r = k (1 - rho) and x_c, x_r the candidate's and the reference's error counts
after n errors. Validity: each likelihood ratio L_n(theta)/L_n(rho) with theta > rho is a
nonnegative martingale with mean 1 when the true share is rho, and a supermartingale when it is
any share below rho (its one-step expectation is increasing in the true share), so the truncated
mixture is a nonnegative supermartingale under the whole one-sided null theta <= rho and Ville's
inequality gives P(exists n: BF_n >= 1/alpha) <= alpha. The sequential p-value
p_n = min(p_{n-1}, 1/BF_n) is therefore anytime-valid. Restricting the mixture, rather than
dropping the evidence whenever the candidate's share is below rho, spends the whole alpha on the
direction that matters; and when the candidate's observed share is at most rho, every
theta > rho has L_n(theta) <= L_n(rho) (the log-likelihood is concave with its maximum at the
observed share), so BF_n <= 1: fewer candidate errors can never cause a hold.

Per error kind (`kind_mixture_pvalues`): conditional on an error being of kind j, its arm label
is still Bernoulli(rho) under the null, so the Bayes factor of kind j's events alone is a test
supermartingale on the whole event stream (it stays put on other kinds' events). A fixed-weight
average of such processes is one too (Vovk and Wang), so

    BF_mix,n = (1 - s) BF_all,n + (s / J) sum_j BF_j,n

with s and the J kinds fixed by the policy (never by the data) gives one anytime-valid p-value
p_n = min(p_{n-1}, 1/BF_mix,n) for the scenario. It is never weaker than the Bonferroni split
it replaces: the average exceeds every weighted term, so a new error kind hidden among common
ones (invisible to the pooled test) and a general rise (spread thin over kinds) both show.
The per-kind p-values reported beside it, 1 / (w_j BF_j) running minima, are each implied by
the mixture: a kind that crosses its own threshold makes the mixture cross too, so reporting
them costs no extra error budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.special import betaincc, betaln, logsumexp

__all__ = [
    "KindMixture",
    "block_fractions",
    "kind_mixture_pvalues",
    "log_bayes_factors",
    "log_ceiling_capital",
    "log_ceiling_evalue",
    "sequential_count_pvalue",
    "sequential_count_pvalues",
]


def _labels(labels: np.ndarray) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError("labels must be one-dimensional")
    if arr.size and not np.isin(arr, (0, 1)).all():
        raise ValueError("labels must be 0 (reference) or 1 (candidate)")
    return arr.astype(np.int64)


def _check(rho: float, k: float) -> None:
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be in (0, 1), got {rho}")
    if not k > 0.0:
        raise ValueError(f"k must be > 0, got {k}")


def log_bayes_factors(labels: np.ndarray, rho: float = 0.5, k: float = 10.0) -> np.ndarray:
    """log BF_n after each event n = 1..N, vectorised over the whole sequence."""
    _check(rho, k)
    arr = _labels(labels)
    x_c = np.cumsum(arr).astype(np.float64)
    x_r = np.arange(1, arr.size + 1, dtype=np.float64) - x_c
    a_c = k * rho
    a_r = k * (1.0 - rho)
    # P(theta > rho) under the posterior; it underflows to 0 only when the candidate's share is
    # far below rho, where log BF = -inf (no evidence) is the right answer.
    with np.errstate(divide="ignore"):
        log_tail_post = np.log(betaincc(a_c + x_c, a_r + x_r, rho))
    log_tail_prior = math.log(float(betaincc(a_c, a_r, rho)))
    out = (
        betaln(a_c + x_c, a_r + x_r)
        - betaln(a_c, a_r)
        + log_tail_post
        - log_tail_prior
        - x_c * math.log(rho)
        - x_r * math.log1p(-rho)
    )
    return np.asarray(out, dtype=np.float64)


def sequential_count_pvalues(labels: np.ndarray, rho: float = 0.5, k: float = 10.0) -> np.ndarray:
    """The running p-values p_1..p_N (non-increasing), for reports and tests."""
    log_bf = log_bayes_factors(labels, rho, k)
    if log_bf.size == 0:
        return np.ones(0, dtype=np.float64)
    with np.errstate(over="ignore"):
        inv = np.exp(-np.maximum(log_bf, -700.0))
    return np.minimum.accumulate(np.minimum(inv, 1.0))


def sequential_count_pvalue(labels: np.ndarray, rho: float = 0.5, k: float = 10.0) -> float:
    """Anytime-valid one-sided p-value after all events (1.0 when there are none).

    labels are the arms of the errors in the order they happened: 0 = reference,
    1 = candidate; rho is the candidate's share of the traffic.
    """
    path = sequential_count_pvalues(labels, rho, k)
    return float(path[-1]) if path.size else 1.0


def _running_pvalues(log_e: np.ndarray, running: bool = True) -> np.ndarray:
    with np.errstate(over="ignore"):
        inv = np.minimum(np.exp(-np.maximum(log_e, -700.0)), 1.0)
    return np.minimum.accumulate(inv) if running else inv


@dataclass(frozen=True)
class KindMixture:
    """Result of the per-kind mixture test on one scenario's errors.

    pvalue: the scenario's anytime-valid p-value (mixture of the pooled and per-kind tests).
    kind_pvalues: per kind that had an event, 1 / (w_j BF_j) at its running minimum (each
        implied by `pvalue`, reported to say which kind drives it).
    """

    pvalue: float
    kind_pvalues: dict[str, float]


def kind_mixture_pvalues(
    labels: np.ndarray,
    kinds: Sequence[str],
    tested_kinds: Sequence[str],
    rho: float = 0.5,
    k: float = 10.0,
    kind_share: float = 0.5,
    running: bool = True,
) -> KindMixture:
    """Anytime-valid p-value of "the candidate has more errors", pooled and per kind.

    labels: arms of the errors in time order (0 reference, 1 candidate); kinds: each error's
    kind, same order; tested_kinds: the policy's kinds, each with its own component (any other
    kind goes to a shared "other" component). kind_share: the weight s of the per-kind part.
    running False: the order of the events is unknown, so only the Bayes factors at the final
    counts are used (each depends on the counts alone): a valid p-value at that one time.
    """
    arr = _labels(labels)
    if len(kinds) != arr.size:
        raise ValueError(f"{len(kinds)} kinds for {arr.size} labels")
    if not 0.0 <= kind_share <= 1.0:
        raise ValueError(f"kind_share must be in [0, 1], got {kind_share}")
    if arr.size == 0:
        return KindMixture(1.0, {})
    buckets = [*tested_kinds, "other"]
    index = {name: i for i, name in enumerate(tested_kinds)}
    bucket = np.array([index.get(kd, len(tested_kinds)) for kd in kinds], dtype=np.int64)
    n = arr.size
    terms: list[np.ndarray] = []
    if kind_share < 1.0:
        terms.append(math.log1p(-kind_share) + log_bayes_factors(arr, rho, k))
    kind_p: dict[str, float] = {}
    if kind_share > 0.0:
        log_w = math.log(kind_share / len(buckets))
        for j, name in enumerate(buckets):
            where = np.flatnonzero(bucket == j)
            path = np.zeros(n, dtype=np.float64)
            if where.size:
                own = log_bayes_factors(arr[where], rho, k)
                # Constant between the kind's own events, 0 (BF = 1) before its first one.
                step = np.zeros(n, dtype=np.int64)
                step[where] = np.arange(1, where.size + 1)
                filled = np.maximum.accumulate(step)
                path = np.where(filled > 0, np.concatenate([[0.0], own])[filled], 0.0)
                kind_p[name] = float(_running_pvalues(log_w + own, running)[-1])
            terms.append(log_w + path)
    log_mix = logsumexp(np.vstack(terms), axis=0)
    return KindMixture(float(_running_pvalues(np.asarray(log_mix), running)[-1]), kind_p)


def log_ceiling_evalue(errors: int, requests: int, ceiling: float) -> float:
    """log of an e-process against "this engine's error rate is at most `ceiling`".

    Robbins' beta-binomial mixture (H. Robbins, "Statistical methods related to the law of the
    iterated logarithm", Annals of Mathematical Statistics 41(5), 1970), restricted to rates
    above the ceiling: E_n = E_{p ~ Beta(1, b) | p > c} [p^k (1-p)^(n-k) / (c^k (1-c)^(n-k))]
    after k errors in n requests. Each likelihood ratio with p > c is a supermartingale under
    any rate at most c, so their mixture is one too, and rejecting once E_n >= 1/alpha holds
    an engine at or under the ceiling with probability at most alpha however often the gate
    looks. b = 1/(2c) - 1 puts the prior's mean near twice the ceiling, where a breach worth
    holding sits. A ceiling of 0 is broken by the first error (log E = inf); of 1, never.
    """
    if errors < 0 or requests < errors:
        raise ValueError(f"need 0 <= errors <= requests, got {errors} of {requests}")
    if ceiling <= 0.0:
        return math.inf if errors > 0 else 0.0
    if ceiling >= 1.0:
        return -math.inf
    a = 1.0
    b = max(1.0 / (2.0 * ceiling) - 1.0, 1.0)
    k, rest = float(errors), float(requests - errors)
    post = betaln(a + k, b + rest) - betaln(a, b)
    tail_post = _log_beta_sf(ceiling, a + k, b + rest)
    tail_prior = _log_beta_sf(ceiling, a, b)
    null = k * math.log(ceiling) + rest * math.log1p(-ceiling)
    return float(post + tail_post - tail_prior - null)


def _log_beta_sf(x: float, a: float, b: float) -> float:
    return float(stats.beta.logsf(x, a, b))


_CEILING_BETS = np.array([0.9] + [2.0**-k for k in range(1, 11)])


def block_fractions(error_ids: np.ndarray, first_id: int, requests: int, block: int) -> np.ndarray:
    """The failed fraction of each complete block of `block` consecutive requests."""
    n = requests // block
    if n == 0:
        return np.zeros(0)
    which = (np.asarray(error_ids, np.int64) - first_id) // block
    counts = np.bincount(which[which < n], minlength=n)
    return np.asarray(counts / block, np.float64)


def log_ceiling_capital(fractions: np.ndarray, ceiling: float) -> float:
    """log of the largest capital so far of bets against "the failed fraction of a block of
    requests is at most `ceiling` on average" (I. Waudby-Smith and A. Ramdas, "Estimating
    means of bounded random variables by betting", JRSS B 86(1), 2024).

    Each block's fraction f is in [0, 1]; a bet lam in [0, 1/ceiling) turns capital K into
    K (1 + lam (f - ceiling)), a nonnegative supermartingale whenever each block's conditional
    mean is at most the ceiling, whatever the dependence inside a block: a burst of errors
    moves one block, not many coins. The average over a fixed grid of bets (0.9, 1/2, ...,
    1/1024 of 1/ceiling) is one too, so by Ville's inequality its running maximum reaches
    1/alpha with probability at most alpha. A ceiling of 0 is broken by the first error (inf);
    of 1, never (-inf).
    """
    f = np.asarray(fractions, np.float64)
    if ceiling <= 0.0:
        return math.inf if bool((f > 0.0).any()) else 0.0
    if ceiling >= 1.0 or f.size == 0:
        return -math.inf if ceiling >= 1.0 else 0.0
    lam = _CEILING_BETS / ceiling
    steps = np.log1p(np.outer(lam, f - ceiling))
    paths = np.cumsum(steps, axis=1)
    top = paths.max(axis=0)
    mix = top + np.log(np.mean(np.exp(paths - top), axis=0))
    return float(max(mix.max(), 0.0))
