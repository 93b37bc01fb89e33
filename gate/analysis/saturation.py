"""Saturation: an engine whose queue grows through a scenario is named, not averaged.

References:
    D. V. Lindley, "The theory of queues with a single server", Proc. Cambridge Philosophical
    Society 48(2), 1952 (the waiting-time recursion: w_i = max(0, w_{i-1} + s_{i-1} - a_i)).
    J. D. C. Little, "A proof for the queuing formula L = lambda W", Operations Research 9(3),
    1961.
    H. B. Mann, "Nonparametric tests against trend", Econometrica 13(3), 1945 (Kendall's tau
    of a series against time).

Why: an engine that cannot serve the offered rate builds a queue, and its latency then grows
with time instead of fluctuating around a level: the paired checks average that growth into
one ratio (a candidate at TTFT p50 44.5 s against 5.6 s is "slower", not "overloaded"), and
nothing says that the reference, whose 5.6 s for a 64-token prompt is itself queueing, was
overloaded too, which voids the comparison. This module reads each engine's TTFT against its
send time and names the growing queue.

What tells a growing queue apart. When arrivals (rate lambda) exceed service (rate mu), each
request waits for the backlog the ones before it left, and the backlog grows by lambda - mu per
second: the wait grows linearly with send time, by lambda/mu - 1 seconds per second, and the
engine completes mu requests per second, a share mu/lambda of the offered rate. A stable engine
differs in both: a steadily slow engine has a high but flat latency and completes what it is
offered; a warm-up transient is high early and flat after; a stable queue near capacity
(utilisation 90%) wanders, but its wait is bounded (it empties again and again), so over a
scenario it neither gains a fixed share of the elapsed time nor falls behind the offered rate.
An engine is called saturated when all of these hold:

1. A trend: the median TTFT of `TREND_BLOCKS` equal-time blocks of the scenario rises with the
   block's time, by a one-sided Kendall test (exact) at `alpha`. Requests that share a batch
   share its fate, so single requests are not independent; medians of blocks much longer than
   a batch are, under short-range dependence, and so the test is on blocks. Under no trend, and
   blocks that are independent, it holds the rate of false calls at `alpha` whatever the
   latency's distribution (heavy tails, batch noise), because every other condition below is
   only an extra requirement. A stable queue near capacity is dependent over hundreds of
   requests (at 90% utilisation the block test alone rejects in about 5% of scenarios of 400
   requests): there conditions 2 and 3 do the work.
2. Growth that is large: the last quarter's median TTFT is at least `MIN_GROWTH` times the
   first quarter's, and it rose by at least `MIN_SLOPE` seconds per second of scenario between
   the two quarters (the slope, from the quarters' medians and mean send times). The slope is
   the queue's signature: a saturated queue's wait gains lambda/mu - 1 of the elapsed time, a
   stable one's is bounded, so its slope falls as the scenario lengthens. The ratio keeps a rise
   that is small against the engine's own latency (a drift of an engine with long prompts) from
   being called a queue; it is low (1.5, not "several") because the gate discards a warm-up,
   and a queue already grown by then starts the scenario high: from an empty queue the
   quarters' medians part by up to (7/8) / (1/8) = 7x, from a backlog w0 by much less.
3. Throughput below the offered rate: the engine's successful completions per second, between
   its `SHARE_TRIM` and 1 - `SHARE_TRIM` completions (send + e2e, else the first token), are at
   most `MAX_SERVED_SHARE` of the offered rate. The offered rate is the schedule as sent: the
   arm's sends (successes and errors) per second between the same order statistics; the
   caller's nominal rate stands in only where the send times are approximated from it. The
   schedule is open-loop, so the sends keep to it whatever the engine does, and they are what
   the engine had to serve: a Poisson schedule of 400 requests strays about 5% from its nominal
   rate, which would move the share as much. A failed request is not served. Spans between
   order statistics are not moved by a constant latency, so a slow engine that keeps up reads
   100%; the trim keeps a straggler at either end from deciding. By Little's law this is the
   same fact as 2 measured on the counts: share = 1 / (1 + slope), 0.9 <-> 0.11.

Thresholds, and what they cost. A share of at most 90% and a slope of 0.1 s/s name an engine
that serves no more than about nine tenths of its load, whose wait grows by a minute in a
ten-minute scenario; an overload of 5-10% (share 0.91-0.95) is called only sometimes, because
a stable queue at 95% utilisation wanders as far over a few hundred requests. In simulation
(FIFO queues, Poisson arrivals, service times sharing a lognormal factor per batch of 8; 600
runs per stable case, 300 per overload), single-slot engines over 400 requests: at 90%
utilisation none was called, at 95% 0.3%; at 110% 42%, at 120% 92%, at 150% all. Over 200
requests a stable queue is called more often (90%: 0.7%, 95%: 4%), over 1000 never; eight
slots or bursty arrivals (gamma, shape 0.5) change little. At 95% the latency is a random walk
of the queue, and a `gate.environment` hold for a reference there is not wrong.

What comes back: the candidate alone saturated is a failed check
"{scenario}.saturation.candidate" (group "overload"; it holds): it cannot serve the rate the
reference serves. The reference saturated (with or without the candidate) is a
`gate.environment` check, undecided and required, as errors.py makes for an unhealthy test
bed: the load was beyond what the test bed can serve, so the comparison is void, and the
message suggests a rate. Neither is no check: this is a detector, not a test of headroom (an
engine at 95% utilisation is rarely called, and a pass would read as if it were shown to
cope); the latency checks judge the comparison, and `queue_growth` gives the evidence to a
report that wants it. Only steady open-loop scenarios are meant: a peak or overload phase is
beyond capacity by design, and a closed loop (fixed concurrency) cannot grow a queue.
Everything is read from the samples given, so a prefix of a scenario (a sequential look) is
judged on its own span. A queue that client timeouts pin at a cap early in the scenario has
stopped growing and is not called here: its timeouts are the errors checks' to judge.

The numbers reported are medians per quarter, the growth factor, the slope and the completion
rate against the offered rate: no interval (a confidence interval of a ratio of a growing
latency spans orders of magnitude and says nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from scipy import stats

from gate.analysis.checks import quotient, statistic_check
from gate.analysis.errors import ENVIRONMENT
from gate.analysis.types import ArmSamples, Check, ScenarioSamples
from gate.core.vocabulary import Role

__all__ = [
    "ENVIRONMENT",
    "MAX_SERVED_SHARE",
    "MIN_GROWTH",
    "MIN_REQUESTS",
    "MIN_SLOPE",
    "POSITION_GROWTH",
    "TREND_BLOCKS",
    "QueueGrowth",
    "queue_growth",
    "queueing_warning",
    "saturation_checks",
]

TREND_BLOCKS = 16
"""Equal-time blocks of the trend test. Sixteen blocks give a one-sided exact Kendall p-value
down to 1/16! (far below any alpha the gate spends) while each block stays many batches long
in a scenario of a few hundred requests, so block medians are close to independent."""

MIN_BLOCK_REQUESTS = 4
"""A block with fewer TTFT samples has no median worth ranking; it is left out of the test."""

MIN_BLOCKS = 8
"""Blocks the trend test needs (8! = 40320: p down to 2.5e-5, below the default alpha)."""

MIN_REQUESTS = TREND_BLOCKS * MIN_BLOCK_REQUESTS
"""TTFT samples an engine needs before its queue is judged at all."""

MIN_GROWTH = 1.5
"""Last quarter's median TTFT over the first's, at least (module docstring, 2)."""

MIN_SLOPE = 0.1
"""Seconds of TTFT gained per second of scenario between the first and last quarter, at least:
a wait that grows by a tenth of the elapsed time (an engine serving about 1/1.1 of its load)."""

MAX_SERVED_SHARE = 0.9
"""Completions per second over the offered rate, at most: 1/(1 + MIN_SLOPE), about."""

SHARE_TRIM = 0.05
"""The completion and send rates are read between these order statistics (5% and 95%)."""

POSITION_GROWTH = 3.0
"""Without send times in seconds (no offsets, ids or offered rate) neither the slope nor the
throughput can be read, and a growing queue is called on the trend and a growth of the last
quarter's median to at least this many times the first's: "several times", which a stable
engine's drift does not reach and a queue growing from empty does (up to 7x)."""

SUGGESTED_LOAD = 0.8
"""The rate a saturated reference's message suggests: this share of what it completed, the
utilisation at which a queue is stable and its latency still mostly service."""

TimeBasis = Literal["offsets", "ids", "position"]


@dataclass(frozen=True)
class QueueGrowth:
    """What one engine's TTFT did through one scenario: the evidence behind a saturation call.

    quarter_medians_ms: median TTFT of the samples sent in each quarter of the scenario's time.
    growth: the last quarter's median over the first's.
    trend_p: one-sided exact Kendall p-value of the block medians rising with time; blocks: how
        many equal-time blocks it ranked.
    slope: seconds of TTFT gained per second of scenario between the first and last quarter
        (None without send times in seconds).
    served_rate, offered_rate: requests per second completed (between the trimmed order
        statistics) and offered (sent, or the caller's rate where the send times are
        approximated from it); served_share: their quotient (None without send times).
    time_basis: where the send times came from: "offsets" (measured), "ids" or "position"
        (approximated: request id or order over the offered rate, or in requests when there is
        no rate); completions: "e2e" (send + e2e) or "first_token" (send + TTFT).
    """

    role: Role
    samples: int
    quarter_medians_ms: tuple[float, float, float, float]
    growth: float
    trend_p: float
    blocks: int
    slope: float | None
    served_rate: float | None
    offered_rate: float | None
    served_share: float | None
    time_basis: TimeBasis
    seconds: bool
    completions: Literal["e2e", "first_token"]
    alpha: float

    @property
    def trend(self) -> bool:
        return self.trend_p <= self.alpha

    def shortfalls(self) -> list[str]:
        """Why this engine is not called saturated; empty when it is."""
        out = []
        if not self.trend:
            out.append(
                f"no significant rise (Kendall p={self.trend_p:.2g}, alpha {self.alpha:.2g})"
            )
        if not self.seconds:
            if self.growth < POSITION_GROWTH:
                out.append(f"a rise of {self.growth:.2f}x, under {POSITION_GROWTH:g}x")
            return out
        if self.growth < MIN_GROWTH:
            out.append(f"a rise of {self.growth:.2f}x, under {MIN_GROWTH:g}x")
        if self.slope is None or self.slope < MIN_SLOPE:
            slope = "?" if self.slope is None else f"{self.slope:.3f}"
            out.append(f"a gain of {slope} s per second, under {MIN_SLOPE:g}")
        if self.served_share is None or self.served_share > MAX_SERVED_SHARE:
            share = "?" if self.served_share is None else f"{self.served_share:.0%}"
            out.append(f"completions at {share} of the offered rate, above {MAX_SERVED_SHARE:.0%}")
        return out

    @property
    def saturated(self) -> bool:
        return not self.shortfalls()

    def describe(self) -> str:
        """The growth in words: quarter medians, factor, trend, slope and throughput."""
        q = self.quarter_medians_ms
        text = (
            f"TTFT median rose from {_dur(q[0])} in the first quarter to {_dur(q[3])} in the "
            f"last ({self.growth:.3g}x; quarters {', '.join(_dur(v) for v in q)}; rising over "
            f"{self.blocks} time blocks, Kendall {_p(self.trend_p)})"
        )
        if self.slope is not None:
            text += f", its wait gaining {self.slope:.2g} s per second"
        if self.served_rate is not None and self.offered_rate is not None:
            of = (
                f"the {_rate(self.offered_rate)}/s sent"
                if self.time_basis == "offsets"
                else f"the offered {_rate(self.offered_rate)}/s"
            )
            text += (
                f"; it completed {_rate(self.served_rate)} requests/s of {of} "
                f"({self.served_share:.0%})"
            )
        return text


def _dur(ms: float) -> str:
    if not math.isfinite(ms):
        return "-"
    if ms < 1000.0:
        return f"{ms:.3g} ms"
    return f"{ms / 1000.0:.3g} s"


def _rate(r: float) -> str:
    return f"{r:.3g}"


def _p(p: float) -> str:
    return "p<1e-12" if p < 1e-12 else f"p={p:.2g}"


def _time_axis(
    arm: ArmSamples, offered_rate: float | None
) -> tuple[np.ndarray, TimeBasis, bool] | None:
    """Send time of each TTFT sample: seconds when known or approximated at the offered rate,
    else the request's place in the schedule (in requests). None when all are sent at once."""
    n = arm.ttft_ms.size
    rate = offered_rate if offered_rate is not None and offered_rate > 0.0 else None
    if "ttft" in arm.offsets_s:
        t = np.asarray(arm.offsets_s["ttft"], dtype=np.float64)
        basis: TimeBasis = "offsets"
        seconds = True
    else:
        if "ttft" in arm.ids:
            t = np.asarray(arm.ids["ttft"], dtype=np.float64) - float(arm.first_id)
            basis = "ids"
        else:
            t = np.arange(n, dtype=np.float64)
            basis = "position"
        seconds = rate is not None
        if rate is not None:
            t = t / rate
    if n == 0 or float(t.max() - t.min()) <= 0.0:
        return None
    return t, basis, seconds


def _completions(
    arm: ArmSamples, t: np.ndarray, basis: TimeBasis
) -> tuple[np.ndarray, Literal["e2e", "first_token"]]:
    """Completion times: send + e2e where e2e is known on the same clock, else first tokens."""
    e2e = arm.e2e_ms
    if e2e.size and basis == "offsets" and "e2e" in arm.offsets_s:
        return np.asarray(arm.offsets_s["e2e"]) + e2e / 1000.0, "e2e"
    if e2e.size and e2e.size == arm.ttft_ms.size and basis != "offsets":
        return t + e2e / 1000.0, "e2e"
    return t + arm.ttft_ms / 1000.0, "first_token"


def _span_rate(times: np.ndarray) -> float | None:
    """Events per second between the SHARE_TRIM and 1 - SHARE_TRIM order statistics."""
    x = np.sort(times)
    m = x.size
    if m < 2:
        return None
    j = math.floor(SHARE_TRIM * (m - 1))
    k = math.ceil((1.0 - SHARE_TRIM) * (m - 1))
    span = float(x[k] - x[j])
    return (k - j) / span if k > j and span > 0.0 else None


def _sent_rate(arm: ArmSamples, t: np.ndarray) -> float | None:
    """The schedule's rate as sent: every request's send (successes and, where their times
    match their count, errors) per second between the trimmed order statistics."""
    errors = arm.error_offsets_s
    if errors.size and errors.size == arm.error_count:
        return _span_rate(np.concatenate([t, errors]))
    return _span_rate(t)


def queue_growth(
    arm: ArmSamples,
    role: Role,
    *,
    offered_rate: float | None = None,
    alpha: float = 0.001,
) -> QueueGrowth | None:
    """One engine's TTFT against its send time (module docstring); None with fewer than
    MIN_REQUESTS samples, fewer than MIN_BLOCKS usable blocks or no spread of send times."""
    y = arm.ttft_ms
    if y.size < MIN_REQUESTS:
        return None
    axis = _time_axis(arm, offered_rate)
    if axis is None:
        return None
    t, basis, seconds = axis
    t0, span = float(t.min()), float(t.max() - t.min())
    block = np.minimum(((t - t0) / span * TREND_BLOCKS).astype(np.int64), TREND_BLOCKS - 1)
    counts = np.bincount(block, minlength=TREND_BLOCKS)
    kept = np.flatnonzero(counts >= MIN_BLOCK_REQUESTS)
    if kept.size < MIN_BLOCKS:
        return None
    medians = np.array([np.median(y[block == b]) for b in kept])
    if np.ptp(medians) == 0.0:
        trend_p = 1.0
    else:
        res = stats.kendalltau(kept.astype(np.float64), medians, alternative="greater")
        trend_p = float(res.pvalue) if math.isfinite(res.pvalue) else 1.0
    quarter = block * 4 // TREND_BLOCKS
    if not (np.any(quarter == 0) and np.any(quarter == 3)):
        return None
    q_med = tuple(
        float(np.median(y[quarter == q])) if np.any(quarter == q) else math.nan for q in range(4)
    )
    first, last = q_med[0], q_med[3]
    growth = last / first if first > 0.0 else (math.inf if last > 0.0 else 1.0)
    slope = served = offered = share = None
    completions, kind = _completions(arm, t, basis)
    if seconds:
        dt = float(t[quarter == 3].mean() - t[quarter == 0].mean())
        slope = (last - first) / 1000.0 / dt if dt > 0.0 else None
        served = _span_rate(completions)
        offered = _sent_rate(arm, t) if basis == "offsets" else offered_rate
        share = served / offered if served is not None and offered else None
    return QueueGrowth(
        role=role,
        samples=int(y.size),
        quarter_medians_ms=(q_med[0], q_med[1], q_med[2], q_med[3]),
        growth=float(growth),
        trend_p=trend_p,
        blocks=int(kept.size),
        slope=slope,
        served_rate=served,
        offered_rate=offered,
        served_share=share,
        time_basis=basis,
        seconds=seconds,
        completions=kind,
        alpha=alpha,
    )


def saturation_checks(
    s: ScenarioSamples,
    notes: list[str],
    *,
    offered_rate: float | None = None,
    alpha: float = 0.001,
) -> list[Check]:
    """Saturation of one steady open-loop scenario, per engine (module docstring).

    offered_rate: the schedule's nominal requests per second, when known: it places the
        requests in time where their send offsets are missing (by request id or order); where
        they are known, the offered rate is read from the sends themselves.
    alpha: the level of each engine's trend test, and so a bound on the rate of false calls of
        each check when blocks are independent and latency does not trend.
    Returns [] when neither engine's queue grows, a failed "{scenario}.saturation.candidate"
    check when only the candidate's does, and a `gate.environment` check (undecided, required)
    when the reference's does. Notes say where time was approximated, where an engine had too
    few samples to judge and where a significant rise fell short of a growing queue.
    """
    found = _queue_growths(s, notes, offered_rate, alpha)
    ref, cand = found["reference"], found["candidate"]
    samples = (s.reference.ttft_ms.size, s.candidate.ttft_ms.size)
    ref_share = ref.served_share if ref is not None else None
    cand_share = cand.served_share if cand is not None else None
    # What both checks report: each engine's completions as a share of the rate sent.
    shared = {
        "scenario": s.name,
        "reference": ref_share,
        "candidate": cand_share,
        "ratio": quotient(ref_share, cand_share),
        "samples": samples,
        "alpha": alpha,
    }
    # A reference that completed no more than MAX_SERVED_SHARE of the rate sent fell behind
    # too, even where its rise missed a condition of a growing queue (its queue may have
    # stopped growing at a plateau): a candidate's growing queue beside it is the test bed's
    # overload, not the candidate's (seen on real vLLM: both at 38-43% of 7.9/s).
    # Its completions alone do not say it: a healthy reference whose answers vary widely in
    # length (e2e 0.5-20 s) completes over a wider span than it was sent over and reads a share
    # of 0.8 in a short scenario; so its TTFT must show the queue too (rose MIN_GROWTH-fold,
    # or queued QUEUEING_FACTOR-fold over its first requests).
    ref_behind = ref is not None and (
        ref.saturated
        or (
            cand is not None
            and cand.saturated
            and ref.served_share is not None
            and ref.served_share <= MAX_SERVED_SHARE
            and (ref.growth >= MIN_GROWTH or queueing_warning(s) is not None)
        )
    )
    if ref is not None and ref_behind:
        return [_reference_behind(s, ref, cand, shared)]
    if cand is not None and cand.saturated:
        return [_candidate_saturated(s, ref, cand, offered_rate, shared)]
    queueing = queueing_warning(s)
    return [queueing] if queueing is not None else []


def _queue_growths(
    s: ScenarioSamples, notes: list[str], offered_rate: float | None, alpha: float
) -> dict[Role, QueueGrowth | None]:
    """Each engine's queue growth, with the notes on what could not be judged or was guessed."""
    found: dict[Role, QueueGrowth | None] = {}
    arms: tuple[tuple[Role, ArmSamples], ...] = (
        ("reference", s.reference),
        ("candidate", s.candidate),
    )
    for role, arm in arms:
        g = queue_growth(arm, role, offered_rate=offered_rate, alpha=alpha)
        found[role] = g
        if g is None:
            if arm.ttft_ms.size:
                notes.append(
                    f"Saturation in {s.name}: the {role}'s queue was not judged ("
                    f"{arm.ttft_ms.size} TTFT samples; it needs {MIN_REQUESTS} spread over "
                    f"{MIN_BLOCKS} of {TREND_BLOCKS} time blocks)."
                )
            continue
        if g.time_basis != "offsets":
            how = "request ids" if g.time_basis == "ids" else "send order"
            rate = (
                f"at the offered {_rate(offered_rate)}/s"
                if g.seconds and offered_rate is not None
                else "in requests, so throughput and slope were not read"
            )
            notes.append(
                f"Saturation in {s.name}: the {role}'s send times were approximated from its "
                f"{how} {rate} (no send offsets)."
            )
        short = g.shortfalls()
        if short and g.trend and g.growth >= MIN_GROWTH:
            notes.append(
                f"Saturation in {s.name}: the {role}'s {g.describe()}; not called a growing "
                f"queue: {'; '.join(short)}."
            )
    return found


def _reference_behind(
    s: ScenarioSamples, ref: QueueGrowth, cand: QueueGrowth | None, shared: dict[str, Any]
) -> Check:
    """The environment check of a reference that fell behind the load: the comparison is void."""
    if cand is None:
        also = ""
    elif cand.saturated:
        also = f" The candidate's queue grows too: its {cand.describe()}."
    else:
        q = cand.quarter_medians_ms
        also = (
            f" The candidate's did not (TTFT median {_dur(q[0])} in the first quarter, "
            f"{_dur(q[3])} in the last), but against a reference that was not serving "
            "the load that shows nothing about a rollout."
        )
    lower = (
        f"lower the scenario's rate to about {_rate(SUGGESTED_LOAD * ref.served_rate)}/s "
        f"({SUGGESTED_LOAD:.0%} of what the reference completed)"
        if ref.served_rate is not None
        else "lower the scenario's rate"
    )
    if ref.saturated:
        what = f"The reference's queue grows through {s.name}: its {ref.describe()}."
    else:
        what = f"The reference fell behind in {s.name} too: its {ref.describe()}."
    return statistic_check(
        ENVIRONMENT,
        "errors",
        "environment",
        "undecided",
        f"{what} The load "
        "was beyond what the test bed can serve, so the comparison is void: the "
        f"reference was measured queueing, not serving; {lower} and run the gate "
        f"again.{also}",
        threshold=MAX_SERVED_SHARE if ref.seconds else None,
        **shared,
    )


def _candidate_saturated(
    s: ScenarioSamples,
    ref: QueueGrowth | None,
    cand: QueueGrowth,
    offered_rate: float | None,
    shared: dict[str, Any],
) -> Check:
    """The failed check of a candidate whose queue grows where the reference serves the load."""
    nominal = offered_rate if offered_rate is not None else cand.offered_rate
    offered = f"the offered {_rate(nominal)}/s" if nominal is not None else "the offered load"
    if ref is None:
        serves = "the reference's queue could not be judged"
    else:
        q = ref.quarter_medians_ms
        served = (
            f", completing {ref.served_share:.0%} of it" if ref.served_share is not None else ""
        )
        serves = (
            f"the reference serves it (TTFT median {_dur(q[0])} in the first quarter, "
            f"{_dur(q[3])} in the last{served})"
        )
    return statistic_check(
        f"{s.name}.saturation.candidate",
        "overload",
        "saturation",
        "fail",
        f"The candidate's queue grows through {s.name}: its {cand.describe()}. It "
        f"cannot serve {offered}; {serves}.",
        threshold=MAX_SERVED_SHARE if cand.seconds else None,
        **shared,
    )


QUEUEING_FACTOR = 10.0
"""The reference's TTFT median over the scenario, against the median of its first requests
(sent into an empty queue), at which the scenario measured its queue rather than its service."""

QUEUEING_MIN_MS = 1000.0
"""...and by at least this much: a 10x of a 5 ms TTFT is a batch, not a queue."""

FIRST_REQUESTS = 8
"""The requests sent first (by send time) that stand for the engine's unloaded TTFT."""


def queueing_warning(s: ScenarioSamples) -> Check | None:
    """A warning (`gate.environment`, not holding) when the reference queued through a scenario
    without a growing queue to name: its TTFT median at least QUEUEING_FACTOR times that of its
    first requests, and QUEUEING_MIN_MS more. Seen on real vLLM on an overloaded host: the
    reference's TTFT wandered between 3 s and 34 s (its first requests: 0.1 s) and an A/A gate
    continued on a candidate "3.4x faster"; the comparison then measures two queues, not two
    engines. Computed from the samples alone; it holds nothing, so it costs no false holds."""
    arm = s.reference
    t = arm.offsets_s.get("ttft") if arm.offsets_s else None
    if arm.ttft_ms.size < MIN_REQUESTS or t is None or t.size != arm.ttft_ms.size:
        return None
    first = arm.ttft_ms[np.argsort(t, kind="stable")[:FIRST_REQUESTS]]
    unloaded = float(np.median(first))
    median = float(np.median(arm.ttft_ms))
    if median < QUEUEING_FACTOR * unloaded or median - unloaded < QUEUEING_MIN_MS:
        return None
    message = (
        f"The reference queued through {s.name}: its TTFT median was {_dur(median)} against "
        f"{_dur(unloaded)} for its first {FIRST_REQUESTS} requests ({median / unloaded:.3g}x). "
        "The load was beyond what the test bed serves without a queue, so the latency checks "
        "compare two queues, not two engines; lower the scenario's rate."
    )
    return replace(
        statistic_check(
            ENVIRONMENT,
            "errors",
            "environment",
            "undecided",
            message,
            scenario=s.name,
            reference=median,
            candidate=float(np.median(s.candidate.ttft_ms)) if s.candidate.ttft_ms.size else None,
            samples=(arm.ttft_ms.size, s.candidate.ttft_ms.size),
        ),
        required=False,
        warning=message,
    )
