"""The tail check: is the candidate's latency tail (above the reference's p95) slower than the
reference's by more than a tolerance? An anytime-valid e-process on mirrored pairs.

References:
    S. R. Howard, A. Ramdas, J. McAuliffe and J. Sekhon, "Time-uniform, nonparametric,
    nonasymptotic confidence sequences", Annals of Statistics 49(2), 2021 (sub-exponential
    supermartingales, the psi_E function).
    X. Fan, I. Grama and Q. Liu, "Exponential inequalities for martingales with applications",
    Electronic Journal of Probability 20, 2015 (exp(l x - psi_E(l) x^2) <= 1 + l x, x >= -1).
    I. Waudby-Smith and A. Ramdas, "Estimating means of bounded random variables by betting",
    JRSS B 86(1), 2024 (predictable plug-in bets tuned to a planned sample size).
    J. Ville, "Etude critique de la notion de collectif", 1939.

Why not the p99 check alone: a regression confined to the slowest 5% of requests moves p99 by
its full factor, but a p99 is pinned down by the ~1% of samples around it. At 10,000 requests
per arm the p99 confidence sequences of both arms together span a 1.10x ratio, so a 1.15x tail
regression cannot be told from a tolerated 1.10x. The whole tail carries five times the samples.

The statistic. For mirrored pair i (the i-th successful request of each arm: a request that
failed in one arm only shifts the pairing of later ones by one, a few seconds of a drift that
takes minutes) and a window [a_i, b_i] of latencies (below), with
x+ = min(max(x, log a_i), log b_i):

    W_i(s) = ((log C_i - s)+ - (log R_i)+) / log(b_i / a_i),   in [-1, 1].

(log x)+ - log a is the integral over thresholds T in [a, b] of 1{x > T} dT / T, so W_i(s) is the
difference of the two arms' survival functions, the candidate's at e^s T against the
reference's at T, averaged over the window on a log scale. If every candidate quantile in the
window is at most e^s times the reference's (P(C > e^s T) <= P(R > T) for every T there),
E[W_i(s)] <= 0; a candidate whose tail is r times the reference's puts the balance at s = log r.

The test. For s0 = log(1 + tolerance) and bets 0 <= l_i <= 1/2 fixed before pair i is seen,

    K_t(s) = prod_{i <= t} exp(l_i W_i(s) - psi_E(l_i) W_i(s)^2),  psi_E(l) = -log(1 - l) - l,

is a nonnegative supermartingale whenever each E[W_i(s) | the past] <= 0 (Fan et al.: each
factor is at most 1 + l_i W_i(s), whose conditional mean is then <= 1), so by Ville's inequality
K_t(s0) ever reaching 1/alpha has probability <= alpha: the check fails (the tail is more than
1 + tolerance times the reference's) when K_t(s0) >= 1/alpha at the look, whichever look that
is. It passes when the mirror-image process (bets on -W) reaches 1/alpha at s0. Each factor
falls as s grows (l <= 1/2 keeps l w - psi_E(l) w^2 increasing in w on [-1, 1]), so the s
rejected on each side form half-lines, and the interval of tail ratios not rejected,
[e^s_lo, e^s_hi], is read off by bisection (the rejected end kept, so rounding only widens it):
for a candidate whose tail is exactly r times the reference's it holds r at every look at once
with probability >= 1 - 2 alpha, and the check fails exactly when it lies above 1 + tolerance,
passes exactly when below. The estimate is e^s where the sample mean of W_i(s) is 0.

Everything the test uses is fixed before the pair it applies to, so looks may come at any time:
    - window: the pairs from FIRST_PAIRS on come in epochs, each a quarter as long as
      everything before it; the pairs of an epoch starting at pair m use the reference's own
      `start` and `top` quantiles (policy: p95 and p99.5) of its first m samples. Values above
      the top count as the top: the far tail is the p99 check's, and a bounded window keeps W
      in [-1, 1];
    - bets: l_i = min(1/2, sqrt(2 log(1/alpha) / (v_{i-1} t_opt))), v_{i-1} the mean of
      W_j(s0)^2 over the earlier pairs (shrunk to a prior for the first few), t_opt the planned
      pairs (Waudby-Smith and Ramdas' predictable plug-in, tuned like the quantile sequences to
      the size where the check must finally decide).

What the test assumes, and what it does not: no distribution (no lognormal, no tail shape) and
no i.i.d. over time: the two requests of a pair are sent at the same instant, so a load swing
or drift both engines feel scales both, and the conditional mean of W_i is <= 0 under any such
swing when the candidate's tail is within tolerance. It does assume that, given the past, a
pair is no more likely to land in the candidate's tail than the null allows, which requests
sharing a batch bend: their latencies are positively correlated within each arm. The simulated
gates of calibration.py carry such batches and a drift; tests/gate/analysis/test_tail.py
measures the false-fail rate on the null's boundary under them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gate.analysis.checks import ratio_check
from gate.analysis.latency import fmt_ratio
from gate.analysis.plan import METRIC_LABEL, Plan
from gate.analysis.policy import Policy, quantile_key
from gate.analysis.types import Check, Decision, ScenarioSamples

__all__ = [
    "FIRST_PAIRS",
    "TailTest",
    "TailWindows",
    "tail_checks",
    "tail_test",
    "tail_windows",
]

FIRST_PAIRS = 200
"""Pairs before the first window is fixed: p95 and p99.5 from 200 reference samples."""

EPOCH_GROWTH = 1.25
"""Each epoch is 25% longer than all the pairs before it: the window of a pair is estimated
from at least 80% of the reference's earlier samples, at O(n) total cost."""

MAX_BET = 0.5
"""Largest bet: keeps each factor monotone in s (needs psi_E(l) / l < 1/2, l < 0.58)."""

PRIOR_PAIRS = 100.0
"""Weight, in pairs, of the prior guess of E[W^2] behind the first bets."""

_SEARCH = (math.log(1.25), math.log(16.0))
"""Ratios searched around the threshold: within 1.25x of it first (only pairs near the tail
need indexing), then, when an end or the estimate falls outside, within 16x."""

_XTOL = 1e-3


@dataclass(frozen=True)
class TailWindows:
    """Per judged pair (from index `first` on): log window ends and 1 / their distance."""

    first: int
    log_a: np.ndarray
    log_b: np.ndarray
    inv_width: np.ndarray


def _epoch_bounds(pairs: int) -> list[tuple[int, int]]:
    """Epochs [m, ceil(EPOCH_GROWTH m)) from FIRST_PAIRS on, as offsets into the judged
    pairs."""
    out = []
    m = FIRST_PAIRS
    while m < pairs:
        end = min(math.ceil(EPOCH_GROWTH * m), pairs)
        out.append((m - FIRST_PAIRS, end - FIRST_PAIRS))
        m = end
    return out


def _quantiles(x: np.ndarray, p: float, q: float) -> tuple[float, float]:
    """np.quantile's default (linear) p and q quantiles of x, from one partition."""
    n = x.size
    hp, hq = (n - 1) * p, (n - 1) * q
    kp, kq = math.floor(hp), math.floor(hq)
    kth = sorted({kp, min(kp + 1, n - 1), kq, min(kq + 1, n - 1)})
    part = np.partition(x, kth)
    vp = part[kp] + (hp - kp) * (part[min(kp + 1, n - 1)] - part[kp])
    vq = part[kq] + (hq - kq) * (part[min(kq + 1, n - 1)] - part[kq])
    return float(vp), float(vq)


def tail_windows(ref_log: np.ndarray, pairs: int, start: float, top: float) -> TailWindows:
    """Windows for pairs [FIRST_PAIRS, pairs): the pairs of an epoch starting at pair m use
    the reference's `start` and `top` quantiles of its first m samples."""
    n = max(pairs - FIRST_PAIRS, 0)
    log_a = np.empty(n)
    log_b = np.empty(n)
    for lo, hi in _epoch_bounds(pairs):
        a, b = _quantiles(ref_log[: lo + FIRST_PAIRS], start, top)
        log_a[lo:hi] = a
        log_b[lo:hi] = max(a, b)
    width = log_b - log_a
    inv = np.divide(1.0, width, out=np.zeros_like(width), where=width > 0.0)
    return TailWindows(FIRST_PAIRS, log_a, log_b, inv)


@dataclass(frozen=True)
class TailTest:
    """The test at one look. ratio: the estimate e^s_hat; lower, upper: the anytime interval
    of the tail ratio (0 / inf when unbounded on that side); log_e_fail, log_e_pass: the log
    e-values at the threshold; pairs: pairs judged (after FIRST_PAIRS)."""

    ratio: float
    lower: float
    upper: float
    threshold: float
    log_e_fail: float
    log_e_pass: float
    log_level: float
    pairs: int

    @property
    def fail(self) -> bool:
        return self.log_e_fail >= self.log_level

    @property
    def passed(self) -> bool:
        return self.log_e_pass >= self.log_level


def _psi(lam: np.ndarray) -> np.ndarray:
    return np.asarray(-np.log1p(-lam) - lam, dtype=np.float64)


_SPAN = 256.0
"""Key spacing between epochs in the sorted index; centred log latencies are clipped to
+-_SPAN / 4 for the keys only (thresholds never leave that range)."""


# Rows of _Sorted.prefix: running sums over the sorted pairs of l, l x, psi, psi x, psi x^2,
# psi r, psi r x and x.
_L, _LX, _P, _PX, _PXX, _PR, _PRX, _X = range(8)


@dataclass(frozen=True)
class _Sorted:
    """sum_i l_i W_i(s), sum_i psi_i W_i(s)^2 and sum_i W_i(s) for any s in O(epochs log n).

    Within an epoch the window is fixed, so W_i(s) depends on the pair through its candidate's
    log latency x_i (centred on the window's start) and its clipped reference value r_i: the
    candidate is clipped to 0 when x_i <= s, to the window's width d when x_i >= d + s, and is
    x_i - s in between. With each epoch's pairs sorted by x and running sums of l, l x, psi,
    psi x, psi x^2, psi r, psi r x and x, every sum is a few differences of running sums at two
    searchsorted positions per epoch, for all epochs at once.
    """

    keys: np.ndarray
    prefix: np.ndarray
    last: np.ndarray
    width: np.ndarray
    inv: np.ndarray
    const: np.ndarray

    @classmethod
    def build(
        cls,
        lc: np.ndarray,
        cr: np.ndarray,
        win: TailWindows,
        lam: np.ndarray,
        psi: np.ndarray,
        lowest: float,
    ) -> _Sorted:
        """Index the pairs that can have W != 0 for some s >= lowest (the candidate above the
        window's start there, or the reference inside the window); the rest add nothing."""
        keep = (lc - win.log_a > lowest) | (cr > win.log_a)
        parts, sizes, starts = [], [], []
        for lo, hi in _epoch_bounds(lc.size + FIRST_PAIRS):
            idx = lo + np.flatnonzero(keep[lo:hi])
            parts.append(idx[np.argsort(lc[idx])])
            sizes.append(idx.size)
            starts.append(lo)
        order = np.concatenate(parts)
        epoch = np.repeat(np.arange(len(sizes)), sizes)
        log_a = win.log_a[starts]
        x = lc[order] - log_a[epoch]
        r = cr[order] - log_a[epoch]
        lam_s, psi_s = lam[order], psi[order]
        terms = np.stack(
            [lam_s, lam_s * x, psi_s, psi_s * x, psi_s * x * x, psi_s * r, psi_s * r * x, x]
        )
        prefix = np.concatenate([np.zeros((terms.shape[0], 1)), np.cumsum(terms, axis=1)], axis=1)
        last = np.cumsum(sizes)
        first = last - np.asarray(sizes)
        # Per epoch: sum l r, sum psi r^2, sum r (the reference's side, which s never moves).
        rsums = np.cumsum(np.stack([lam_s * r, psi_s * r * r, r]), axis=1)
        rsums = np.concatenate([np.zeros((3, 1)), rsums], axis=1)
        const = rsums[:, last] - rsums[:, first]
        keys = epoch * _SPAN + np.clip(x, -_SPAN / 4.0, _SPAN / 4.0)
        width = win.log_b[starts] - log_a
        return cls(keys, prefix, last, width, win.inv_width[starts], const)

    def sums(self, s: float) -> tuple[float, float, float]:
        base = np.arange(self.width.size) * _SPAN
        i1 = np.searchsorted(self.keys, base + s, side="right")
        i2 = np.maximum(np.searchsorted(self.keys, base + self.width + s, side="left"), i1)
        mid = self.prefix[:, i2] - self.prefix[:, i1]  # candidate inside the window
        up = self.prefix[:, self.last] - self.prefix[:, i2]  # candidate at its top
        d = self.width
        lam_u = mid[_LX] - s * mid[_L] + d * up[_L]
        psi_uu = mid[_PXX] - 2.0 * s * mid[_PX] + s * s * mid[_P] + d * d * up[_P]
        psi_ru = mid[_PRX] - s * mid[_PR] + d * up[_PR]
        u = mid[_X] - s * (i2 - i1) + d * (self.last - i2)
        inv = self.inv
        return (
            float(inv @ (lam_u - self.const[0])),
            float((inv * inv) @ (psi_uu - 2.0 * psi_ru + self.const[1])),
            float(inv @ (u - self.const[2])),
        )


def _boundary(
    sums: Callable[[float], tuple[float, float, float]],
    pred: Callable[[tuple[float, float, float]], bool],
    lo: float,
    hi: float,
) -> float:
    """pred (of the sums) true at lo and false at hi, monotone in s: the largest s known
    true, to _XTOL."""
    while hi - lo > _XTOL:
        mid = 0.5 * (lo + hi)
        if pred(sums(mid)):
            lo = mid
        else:
            hi = mid
    return lo


def _search(
    sums: Callable[[float], tuple[float, float, float]],
    s0: float,
    level: float,
    lo_s: float,
    hi_s: float,
    fail: bool,
    passed: bool,
) -> tuple[float, float, float]:
    """(s_lower, s_upper, s_hat) within [lo_s, hi_s]: an end that is not bounded there is
    -inf / +inf (or the range's end, which is conservative, when it lies beyond on the
    decided side); the estimate is clipped to the range."""

    def fail_at(x: tuple[float, float, float]) -> bool:  # "ratio <= e^s" rejected
        return x[0] - x[1] >= level

    def not_pass_at(x: tuple[float, float, float]) -> bool:  # "ratio >= e^s" not rejected
        return -x[0] - x[1] < level

    def positive(x: tuple[float, float, float]) -> bool:
        return x[2] > 0.0

    # Each predicate is true below its boundary and false above it (module docstring).
    if fail:
        s_lower = hi_s if fail_at(sums(hi_s)) else _boundary(sums, fail_at, s0, hi_s)
    elif fail_at(sums(lo_s)):
        s_lower = _boundary(sums, fail_at, lo_s, s0)
    else:
        s_lower = -math.inf
    if passed:
        s_upper = lo_s if not not_pass_at(sums(lo_s)) else _boundary(sums, not_pass_at, lo_s, s0)
    elif not_pass_at(sums(hi_s)):
        s_upper = math.inf
    else:
        s_upper = _boundary(sums, not_pass_at, s0, hi_s)
    if positive(sums(hi_s)):
        s_hat = hi_s
    elif not positive(sums(lo_s)):
        s_hat = lo_s
    else:
        s_hat = _boundary(sums, positive, lo_s, hi_s)
    return s_lower, s_upper, s_hat


def tail_test(
    ref: np.ndarray,
    cand: np.ndarray,
    *,
    tolerance: float,
    alpha: float,
    t_opt: int,
    start: float,
    top: float,
) -> TailTest | None:
    """The tail test on two arms' latencies in send order (module docstring); None when there
    are no more than FIRST_PAIRS pairs, so no window is fixed yet."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0.0 < start < top < 1.0:
        raise ValueError(f"need 0 < start < top < 1, got {start}, {top}")
    pairs = int(min(ref.size, cand.size))
    if pairs <= FIRST_PAIRS:
        return None
    lr_all = np.log(np.maximum(np.asarray(ref[:pairs], dtype=np.float64), 1e-12))
    lc_all = np.log(np.maximum(np.asarray(cand[:pairs], dtype=np.float64), 1e-12))
    win = tail_windows(lr_all, pairs, start, top)
    lr = lr_all[FIRST_PAIRS:]
    lc = lc_all[FIRST_PAIRS:]
    n = lr.size
    cr = np.clip(lr, win.log_a, win.log_b)
    s0 = math.log1p(tolerance)
    level = math.log(1.0 / alpha)
    # Bets from the past only: W(s0)^2 of pairs 0..i-1, shrunk to a prior guess of its mean
    # (0.4 x the tail's share: 0.015-0.036 was measured at start 0.95 on lognormal latencies
    # of log-sd 0.1 to 1 and on the simulated engines).
    w0 = (np.clip(lc - s0, win.log_a, win.log_b) - cr) * win.inv_width
    prior = 0.4 * (1.0 - start)
    past = np.concatenate(([0.0], np.cumsum(w0 * w0)[:-1]))
    v = (PRIOR_PAIRS * prior + past) / (PRIOR_PAIRS + np.arange(n))
    lam = np.minimum(MAX_BET, np.sqrt(2.0 * level / (v * max(int(t_opt) - FIRST_PAIRS, 1))))
    psi = _psi(lam)
    log_e_fail = float(np.dot(lam, w0) - np.dot(psi, w0 * w0))
    log_e_pass = float(np.dot(lam, -w0) - np.dot(psi, w0 * w0))

    for half in _SEARCH:
        lo_s, hi_s = s0 - half, s0 + half
        sums = _Sorted.build(lc, cr, win, lam, psi, lo_s).sums
        ends = _search(sums, s0, level, lo_s, hi_s, log_e_fail >= level, log_e_pass >= level)
        if all(lo_s < e < hi_s for e in ends):
            break
    s_lower, s_upper, s_hat = ends
    return TailTest(
        ratio=math.exp(s_hat),
        lower=math.exp(s_lower) if math.isfinite(s_lower) else 0.0,
        upper=math.exp(s_upper) if math.isfinite(s_upper) else math.inf,
        threshold=1.0 + tolerance,
        log_e_fail=log_e_fail,
        log_e_pass=log_e_pass,
        log_level=level,
        pairs=n,
    )


def _slowest_mean(x: np.ndarray, share: float) -> float:
    """Mean of the slowest `share` of the values (at least one)."""
    k = max(1, math.ceil(share * x.size))
    return float(np.partition(x, x.size - k)[x.size - k :].mean())


def _tail_check(
    s: ScenarioSamples,
    metric: str,
    policy: Policy,
    alpha: float,
    t_opt: int | None,
    final: bool,
    notes: list[str],
) -> Check | None:
    ref = s.reference.metric(metric)
    cand = s.candidate.metric(metric)
    tp = policy.tail
    label = f"{METRIC_LABEL[metric]} tail above {quantile_key(tp.start)} in {s.name}"
    pairs = int(min(ref.size, cand.size))
    res = tail_test(
        ref,
        cand,
        tolerance=tp.tolerance,
        alpha=alpha,
        t_opt=pairs if t_opt is None else t_opt,
        start=tp.start,
        top=tp.top,
    )
    if res is None:
        if final:
            notes.append(
                f"{label} not checked: {pairs} requests per arm, and the tail test starts "
                f"after {FIRST_PAIRS}."
            )
        return None
    thr = res.threshold
    interval = f"interval {fmt_ratio(res.lower)}-{fmt_ratio(res.upper)}"
    decision: Decision
    if res.fail:
        decision = "fail"
        message = (
            f"{label} is {fmt_ratio(res.ratio)} the reference ({interval}), above the "
            f"{fmt_ratio(thr, res.lower)} threshold."
        )
    elif res.passed:
        decision = "pass"
        message = (
            f"{label} is within tolerance: at most {fmt_ratio(res.upper, thr)} the reference "
            f"(threshold {fmt_ratio(thr, res.upper)})."
        )
    else:
        if final:
            # One-sided in effect: the tail check adds power to find a tail regression, and
            # a tail it cannot resolve is not a reason to hold (the quantile checks still
            # decide); the note keeps what it saw.
            notes.append(
                f"{label} not established: {fmt_ratio(res.ratio)} the reference, and its "
                f"{interval} includes the {fmt_ratio(thr)} threshold at {pairs} requests per "
                f"arm; no tail regression beyond {fmt_ratio(thr)} was shown."
            )
            return None
        decision = "inconclusive"
        message = (
            f"{label} is undecided: {fmt_ratio(res.ratio)} the reference, but the {interval} "
            f"includes the {fmt_ratio(thr)} threshold; more samples would settle it."
        )
    share = 1.0 - tp.start
    return ratio_check(
        f"{s.name}.{metric}.tail",
        metric,
        decision,
        message,
        scenario=s.name,
        reference=_slowest_mean(ref, share),
        candidate=_slowest_mean(cand, share),
        ratio=res.ratio,
        interval=(res.lower, res.upper),
        threshold=thr,
        samples=(int(ref.size), int(cand.size)),
        alpha=alpha,
    )


def tail_checks(
    scenarios: Sequence[ScenarioSamples],
    policy: Policy,
    notes: list[str],
    *,
    plan: Plan | None = None,
    final: bool = True,
) -> list[Check]:
    """One tail check per scenario x metric with samples in both arms.

    With a plan, its alpha per check and each scenario's planned requests (the bets' tuning);
    without, the tail budget split over the pairs measured and bets tuned to the samples held
    (valid for that one look). final: the scenario has ended, so an undecided check becomes a
    note; before, it is an inconclusive check not yet decided.
    """
    budget = policy.group_alpha("tail")
    measured = [
        (s, m)
        for s in scenarios
        for m in policy.metrics
        if s.reference.metric(m).size and s.candidate.metric(m).size
    ]
    if budget <= 0.0:
        if measured and final:
            notes.append("Tail checks off: alpha_split gives tail no budget.")
        return []
    if not measured:
        return []
    checks = []
    for s, m in measured:
        if plan is None:
            alpha, t_opt = budget / len(measured), None
        else:
            alpha, t_opt = plan.tail_alpha, int(plan.requests[s.name])
        check = _tail_check(s, m, policy, alpha, t_opt, final, notes)
        if check is not None:
            checks.append(check)
    return checks
