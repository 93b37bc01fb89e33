"""The simulated gate of the calibration: two engines' latencies, errors and logits, mirrored
request by request, with an injected difference on the candidate (calibration.py judges them).

A simulated gate is a pure function of its seed (a numpy Generator), so every judge and every
case sees the same draws; `Case` is what is injected, `SimConfig` the engines and the load,
`DependenceModel` how a log latency is built (issue 17).

One simulated gate, per arm, mirrored request i sent at the same instant to both:
    send times: Poisson arrivals at `rate` per second;
    TTFT: median x exp(sigma Z) per request (independent per arm), x a batch factor
        exp(batch_sigma Z) shared by each run of `batch` consecutive requests of one arm (they
        share a prefill batch and its fate), x a drift 1 + drift x sin(2 pi t / period + phase)
        shared by both arms (load swings reach both engines of a mirrored design);
    ITL: the same shape with its own median and sigma (per-request means are narrow);
    errors: each request fails with `error_rate` (kinds http_5xx 60%, timeout 30%,
        stream_error 10%), a failed request has no latency;
    divergence: `prompts` prompts of `tokens` positions over a toy vocabulary; the reference's
        logits are fixed per position and every run adds Gaussian logit noise (alone
        `noise_alone`, under load `noise_load`); teacher-forced and free-run greedy pairs are
        built for reference vs candidate and for the reference's own envelope (alone vs load).
Injected cases multiply the candidate's TTFT (all, or only values above the reference
distribution's p95), its ITL or its error rate; give it 1.25x the logit noise (benign: a
different but correct kernel); add a bug (on 5% of positions an extra logit error of sd 1 nat);
or crash it at a uniformly random request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy import stats

from gate.analysis.divergence import (
    DivergenceSamples,
    GreedyPair,
    GreedyRun,
    Scored,
    TeacherForcedPair,
    Token,
)

__all__ = [
    "ERROR_MIX",
    "Case",
    "DependenceModel",
    "SimConfig",
    "SimulatedArm",
    "SimulatedGate",
    "engine_drift",
    "log_softmax",
    "simulated_gate",
    "tail_threshold",
    "top_dicts",
]

Divergence = Literal["same", "benign", "bug"]
ERROR_MIX: tuple[tuple[str, float], ...] = (
    ("http_5xx", 0.6),
    ("timeout", 0.3),
    ("stream_error", 0.1),
)
ERROR_KINDS_INDEX = {name: i for i, (name, _) in enumerate(ERROR_MIX)}


@dataclass(frozen=True)
class Case:
    """One injected difference of the candidate (all defaults: an A/A gate)."""

    name: str
    ttft: float = 1.0
    tail: float = 1.0
    itl: float = 1.0
    errors: float = 1.0
    divergence: Divergence = "same"
    crash: bool = False
    # Shapes of real regressions (issue 28), on the candidate's TTFT:
    tail_share: float = 0.0  # this share of its requests (at random) ...
    tail_factor: float = 1.0  # ... are this many times slower
    top_share: float = 0.0  # its slowest share (above the reference distribution's quantile)
    top_factor: float = 1.0  # ... is this many times slower
    window: tuple[float, float, float] | None = None  # (start, length) as shares of the run, x
    stall_s: float = 0.0  # a stall of this many seconds a third into the run
    creep: tuple[float, float] | None = None  # (start share, ratio reached at the end)
    timeout_top: float = 0.0  # its slowest share times out (censored at the client timeout)
    episodes: float = 1.0  # its error episodes come this many times as often


@dataclass(frozen=True)
class DependenceModel:
    """How one engine's log latency is built (issue 17): a part common to both engines of a
    mirrored pair (prompt, output length, the load both feel), sd `common`; this engine's batch
    effect, shared by each run of `batch` consecutive requests with the batch boundaries at a
    random phase per engine, sd `batch_sd`; and each request's own part, sd `own`."""

    name: str
    common: float
    batch_sd: float
    batch: int
    own: float


@dataclass(frozen=True)
class SimConfig:
    """The simulated engine and gate (module docstring). Defaults: a moderately loaded engine
    serving fixed-length prompts, TTFT median 80 ms with p99/p50 = 2 (log-sd 0.30, a third of
    its variance from batches), per-request mean ITL 20 ms (log-sd 0.13), 0.5% errors, and a
    load swing of +-5% every five minutes that both engines feel."""

    limit: int = 20_000
    baseline_every: int = 2_500
    rate: float = 20.0
    ttft_ms: float = 80.0
    ttft_sigma: float = 0.28
    itl_ms: float = 20.0
    itl_sigma: float = 0.08
    batch: int = 8
    batch_sigma: float = 0.10
    drift: float = 0.05
    drift_period_s: float = 300.0
    error_rate: float = 0.005
    prompts: int = 48
    tokens: int = 40
    vocab: int = 48
    logit_scale: float = 2.5
    noise_alone: float = 0.03
    noise_load: float = 0.06
    benign_factor: float = 1.25
    bug_fraction: float = 0.05
    bug_sd: float = 1.0
    common_sigma: float = 0.0
    itl_common_sigma: float = 0.0
    itl_batch_sigma: float | None = None
    error_burst: int = 1
    divergence: bool = True
    # Each engine's own drift (issue 28): a +-engine_drift multiplier, a sine of this period at
    # a random phase per engine ("sine"), or a random wander with this correlation time
    # ("wander", an Ornstein-Uhlenbeck process of sd engine_drift).
    engine_drift: float = 0.0
    engine_drift_period_s: float = 15.0
    engine_drift_kind: Literal["sine", "wander"] = "sine"
    # Heavy tails: each request's own part from a Pareto of this shape (0: lognormal only).
    pareto: float = 0.0
    # Error episodes per engine: bad periods starting at this rate (per second), lasting
    # episode_s, failing each request in them with episode_fail (on top of error_rate).
    episode_rate: float = 0.0
    episode_s: float = 10.0
    episode_fail: float = 0.2
    timeout_ms: float = 2_000.0  # the client timeout: a timed-out request reads as this slow

    def with_model(self, model: DependenceModel) -> SimConfig:
        """Both metrics' log latency built by `model` (TTFT and ITL alike)."""
        return replace(
            self,
            ttft_sigma=model.own,
            itl_sigma=model.own,
            batch=model.batch,
            batch_sigma=model.batch_sd,
            itl_batch_sigma=model.batch_sd,
            common_sigma=model.common,
            itl_common_sigma=model.common,
        )


@dataclass(frozen=True)
class SimulatedArm:
    ttft: np.ndarray  # NaN where the request failed (a timeout: the timeout, censored)
    itl: np.ndarray
    error: np.ndarray  # kind index, -1 success
    censored: np.ndarray  # timed out: its TTFT is at least the value given


@dataclass(frozen=True)
class SimulatedGate:
    sent: np.ndarray
    ref: SimulatedArm
    cand: SimulatedArm
    crash_at: int | None
    divergence: DivergenceSamples | None  # None: not simulated (latency-only grids)


def _latency(
    rng: np.random.Generator,
    n: int,
    median: float,
    sigma: float,
    config: SimConfig,
    drift: np.ndarray,
    common: np.ndarray,
    batch_sigma: float,
) -> np.ndarray:
    """One engine's latencies: its own part, its batches (boundaries at a random phase, so
    the two engines' batches do not line up) and the part both engines share."""
    own = rng.standard_normal(n) * sigma
    if config.pareto > 0.0 and n:
        # A Pareto tail (shape `pareto`) on top: rare requests several times slower.
        own = own + np.log(rng.pareto(config.pareto, n) + 1.0) - math.log(2.0) / config.pareto
    which = (np.arange(n) + int(rng.integers(config.batch))) // config.batch
    shared = (rng.standard_normal(int(which[-1]) + 1) * batch_sigma)[which] if n else own
    return np.asarray(median * np.exp(own + shared + common) * drift, dtype=np.float64)


def engine_drift(rng: np.random.Generator, sent: np.ndarray, config: SimConfig) -> np.ndarray:
    """One engine's own drift multiplier at each send time (SimConfig.engine_drift)."""
    if config.engine_drift <= 0.0 or not sent.size:
        return np.ones(sent.size)
    a = config.engine_drift
    if config.engine_drift_kind == "sine":
        phase = rng.uniform(0.0, 2.0 * math.pi)
        return np.asarray(
            1.0 + a * np.sin(2.0 * math.pi * sent / config.engine_drift_period_s + phase)
        )
    # Ornstein-Uhlenbeck in log space, stationary sd a, correlation time period_s.
    decay = np.exp(-np.diff(sent, prepend=sent[0]) / config.engine_drift_period_s)
    noise = rng.standard_normal(sent.size) * a * np.sqrt(1.0 - decay**2)
    x = np.empty(sent.size)
    x[0] = rng.standard_normal() * a
    for i in range(1, sent.size):
        x[i] = decay[i] * x[i - 1] + noise[i]
    return np.asarray(np.exp(x))


def tail_threshold(config: SimConfig) -> float:
    """The reference TTFT distribution's p95 (without drift, which averages out), used by the
    tail-only cases: a fixed property of the simulated engine, not of one run's data."""
    z95 = 1.6448536269514722
    sd = math.sqrt(config.ttft_sigma**2 + config.batch_sigma**2 + config.common_sigma**2)
    return config.ttft_ms * math.exp(z95 * sd)


def _errors(rng: np.random.Generator, n: int, rate: float, burst: int = 1) -> np.ndarray:
    """Each request fails with `rate`; with burst > 1 failures come as events that fail
    `burst` consecutive requests at once (a stall), the failed share staying `rate`."""
    starts = rng.random(n) < min(rate / max(burst, 1), 1.0)
    if burst > 1 and n:
        fails = np.convolve(starts.astype(np.int64), np.ones(burst, np.int64))[:n] > 0
    else:
        fails = starts
    kinds = rng.choice(len(ERROR_MIX), size=n, p=[w for _, w in ERROR_MIX])
    return np.where(fails, kinds, -1).astype(np.int64)


def _episodes(
    rng: np.random.Generator, sent: np.ndarray, config: SimConfig, scale: float
) -> np.ndarray:
    """Which requests fall in one of this engine's bad periods (SimConfig.episode_*)."""
    rate = config.episode_rate * scale
    if rate <= 0.0 or not sent.size:
        return np.zeros(sent.size, np.bool_)
    span = float(sent[-1]) + config.episode_s
    starts = np.sort(rng.uniform(-config.episode_s, span, rng.poisson(rate * span)))
    if not starts.size:
        return np.zeros(sent.size, np.bool_)
    i = np.searchsorted(starts, sent, side="right") - 1
    inside = (i >= 0) & (sent - starts[np.maximum(i, 0)] < config.episode_s)
    return np.asarray(inside & (rng.random(sent.size) < config.episode_fail), np.bool_)


def _shape(
    case: Case, ttft: np.ndarray, sent: np.ndarray, rng: np.random.Generator, config: SimConfig
) -> np.ndarray:
    """The candidate's TTFT under the case's regression shape (Case)."""
    n = ttft.size
    if not n:
        return ttft
    span = float(sent[-1]) if sent.size else 0.0
    if case.tail_share > 0.0:
        hit = rng.random(n) < case.tail_share
        ttft = np.where(hit, ttft * case.tail_factor, ttft)
    if case.top_share > 0.0:
        # The slowest top_share of the engine's distribution (its quantile, drift aside).
        z = float(stats.norm.isf(case.top_share))
        sd = math.sqrt(config.ttft_sigma**2 + config.batch_sigma**2 + config.common_sigma**2)
        cut = config.ttft_ms * math.exp(z * sd)
        ttft = np.where(ttft > cut, ttft * case.top_factor, ttft)
    if case.window is not None:
        start, length, factor = case.window
        inside = (sent >= start * span) & (sent < (start + length) * span)
        ttft = np.where(inside, ttft * factor, ttft)
    if case.stall_s > 0.0:
        at = span / 3.0
        waiting = (sent >= at) & (sent < at + case.stall_s)
        ttft = np.where(waiting, ttft + 1e3 * (at + case.stall_s - sent), ttft)
    if case.creep is not None:
        start, reach = case.creep
        frac = np.clip((sent / max(span, 1e-9) - start) / max(1.0 - start, 1e-9), 0.0, 1.0)
        ttft = ttft * (1.0 + (reach - 1.0) * frac)
    return ttft


def _arm(
    rng: np.random.Generator,
    n: int,
    config: SimConfig,
    drift: np.ndarray,
    case: Case | None,
    common: tuple[np.ndarray, np.ndarray],
    sent: np.ndarray | None = None,
) -> SimulatedArm:
    sent = np.arange(n) / config.rate if sent is None else sent
    own = engine_drift(rng, sent, config)
    itl_batch = config.batch_sigma if config.itl_batch_sigma is None else config.itl_batch_sigma
    ttft = _latency(
        rng,
        n,
        config.ttft_ms,
        config.ttft_sigma,
        config,
        drift * own,
        common[0],
        config.batch_sigma,
    )
    itl = _latency(
        rng, n, config.itl_ms, config.itl_sigma, config, drift * own, common[1], itl_batch
    )
    rate = config.error_rate
    censored = np.zeros(n, np.bool_)
    episodes = 1.0
    if case is not None:
        if case.tail != 1.0:
            ttft = np.where(ttft > tail_threshold(config), ttft * case.tail, ttft)
        # Shapes first, on the reference distribution's quantiles; then the steady factor.
        ttft = _shape(case, ttft, sent, rng, config) * case.ttft
        itl = itl * case.itl
        rate *= case.errors
        episodes = case.episodes
        if case.timeout_top > 0.0 and n:
            censored = ttft >= np.quantile(ttft, 1.0 - case.timeout_top)
    error = _errors(rng, n, rate, config.error_burst)
    bad = _episodes(rng, sent, config, episodes)
    error = np.where(bad & (error < 0), ERROR_KINDS_INDEX["http_5xx"], error)
    # A request slower than the client timeout times out: an error whose TTFT is known to be
    # at least the timeout (the judge reads it as that slow, not as a dropped pair).
    censored = (censored | (ttft >= config.timeout_ms)) & (error < 0)
    error = np.where(censored, ERROR_KINDS_INDEX["timeout"], error)
    ttft = np.where(censored, config.timeout_ms, ttft)
    failed = (error >= 0) & ~censored
    return SimulatedArm(
        np.where(failed, np.nan, ttft), np.where(failed | censored, np.nan, itl), error, censored
    )


def log_softmax(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=-1, keepdims=True)
    out = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
    return np.asarray(out, dtype=np.float64)


def top_dicts(lp: np.ndarray, k: int) -> list[dict[Token, float]]:
    idx = np.argpartition(-lp, k - 1, axis=-1)[:, :k]
    return [{int(t): float(row[t]) for t in ids} for row, ids in zip(lp, idx, strict=True)]


def _run_logits(
    rng: np.random.Generator, base: np.ndarray, noise: float, bug: bool, config: SimConfig
) -> np.ndarray:
    out = base + rng.standard_normal(base.shape) * noise
    if bug:
        hit = rng.random(base.shape[:-1]) < config.bug_fraction
        out = out + hit[..., None] * rng.standard_normal(base.shape) * config.bug_sd
    return out


def _divergence(
    rng: np.random.Generator, config: SimConfig, kind: Divergence, k: int
) -> DivergenceSamples:
    shape = (config.prompts, config.tokens, config.vocab)
    base = rng.standard_normal(shape) * config.logit_scale
    cand_noise = config.noise_load * (config.benign_factor if kind == "benign" else 1.0)
    bug = kind == "bug"

    def teacher(noise_b: float, bug_b: bool) -> list[TeacherForcedPair]:
        ref = log_softmax(_run_logits(rng, base, config.noise_alone, False, config))
        other = log_softmax(_run_logits(rng, base, noise_b, bug_b, config))
        pairs = []
        for p in range(config.prompts):
            tokens = ref[p].argmax(axis=-1)
            pos = np.arange(config.tokens)
            pairs.append(
                TeacherForcedPair(
                    tokens.tolist(),
                    Scored(ref[p][pos, tokens].tolist(), top_dicts(ref[p], k)),
                    Scored(other[p][pos, tokens].tolist(), top_dicts(other[p], k)),
                )
            )
        return pairs

    def greedy(noise_b: float, bug_b: bool) -> list[GreedyPair]:
        # Positions are independent draws in this toy, so a free run is the argmax sequence of
        # each engine's noisy logits; only the first divergence is ever read.
        ref = log_softmax(_run_logits(rng, base, config.noise_alone, False, config))
        other = log_softmax(_run_logits(rng, base, noise_b, bug_b, config))
        pairs = []
        pos = np.arange(config.tokens)
        for p in range(config.prompts):
            ta = ref[p].argmax(axis=-1)
            tb = other[p].argmax(axis=-1)
            pairs.append(
                GreedyPair(
                    GreedyRun(ta.tolist(), ref[p][pos, ta].tolist(), top_dicts(ref[p], k)),
                    GreedyRun(tb.tolist(), other[p][pos, tb].tolist(), top_dicts(other[p], k)),
                )
            )
        return pairs

    return DivergenceSamples(
        teacher=teacher(cand_noise, bug),
        greedy=greedy(cand_noise, bug),
        envelope_teacher=teacher(config.noise_load, False),
        envelope_greedy=greedy(config.noise_load, False),
    )


def simulated_gate(
    case: Case, config: SimConfig, k: int, rng: np.random.Generator, n: int | None = None
) -> SimulatedGate:
    """One gate's data: `n` requests per arm (the limit when None; more for an extension)."""
    n = config.limit if n is None else n
    sent = np.cumsum(rng.exponential(1.0 / config.rate, n))
    phase = rng.uniform(0.0, 2.0 * math.pi)
    drift = 1.0 + config.drift * np.sin(2.0 * math.pi * sent / config.drift_period_s + phase)
    common = (
        rng.standard_normal(n) * config.common_sigma,
        rng.standard_normal(n) * config.itl_common_sigma,
    )
    ref = _arm(rng, n, config, drift, None, common, sent)
    cand = _arm(rng, n, config, drift, case, common, sent)
    crash_at = int(rng.integers(1, config.limit)) if case.crash else None
    divergence = (
        _divergence(rng, config, case.divergence, k)
        if config.divergence or case.divergence != "same"
        else None
    )
    return SimulatedGate(sent, ref, cand, crash_at, divergence)
