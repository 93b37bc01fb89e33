"""Checks on what the engines say about themselves (their Prometheus metrics, sampled by
gate/telemetry while each load scenario runs), candidate against reference under the same
mirrored load. Pure: timelines in, checks and notes out.

preemptions (per scenario, two count tests; alpha from the `engine` budget group, halved)
    A KV cache that runs out at a peak preempts in bursts: one scrape interval may see fifty
    preemptions and the next ten, all of one event. Counting preemptions as independent
    coins would hold identical engines whenever one of them had a burst (the naive test
    does, in tests/gate/analysis/test_engine_metrics.py). So, as the error test does with
    failed requests (errors.py), the scenario's preemptions are judged as events:
    - episodes: scrape intervals in which the counter rose, chained while less than
      `engine.preemption_episode_s` apart (errors.py `burst_events`). Under the null (the
      candidate's episode rate at most (1 + `preemption_tolerance`) x the reference's, both
      Poisson over the same time) the candidate's share of the E episodes is Binomial(E, p0)
      with p0 = (1 + tol) / (2 + tol) at most: a one-sided exact test. It sees bursts that
      come and go over a long scenario.
    - blocks: the scenario cut into time blocks of `engine.preemption_block_s`, a sign test
      over the blocks where the candidate preempted more than (1 + tol) x the reference or
      fewer than it (identical engines are exchangeable under the same mirrored load, so each
      such block is a fair coin when bursts are shorter than a block). It sees a candidate
      that preempts all the time, which is one long episode to the first test.
    Each spends half the scenario's alpha; validity under bursty A/A and power on a
    sustained and on a bursty regression are in the test module. Without evidence the check
    passes when the candidate had no more episodes than allowed, and is otherwise undecided
    and not required (a continue lists it as not shown).
KV cache capacity (once per gate, a rule)
    The engines' configuration as their metrics state it (vLLM's cache_config_info,
    SGLang's max_total_num_tokens, TensorRT-LLM's max blocks x tokens per block): tokens
    where both state them, else blocks; it holds when the candidate's is below
    (1 - `kv_capacity_tolerance`) x the reference's. An image that allocates fewer blocks
    preempts at the next peak, whether or not this gate's load reached it.
prefix-cache hit rate (per scenario, a rule, where the prompts share prefixes)
    Hits / queries over the scenario (counter increments), or the engine's own gauge; judged
    only where the reference's rate is at least `prefix_cache_min_rate`; holds when the
    candidate's is more than `prefix_cache_tolerance` points below.
spec-decode acceptance (per scenario, a rule, where both draft)
    Accepted / drafted tokens over the scenario; holds when the candidate's is below
    (1 - `spec_decode_tolerance`) x the reference's.
queue depth (per scenario, a rule)
    The mean of requests waiting over the scrapes; holds when the candidate's is above
    (1 + `queue_tolerance`) x the reference's + `queue_slack` under the same offered load.

What an engine does not export is a note, never a hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import stats

from gate.analysis.checks import compared, rule_check, statistic_check
from gate.analysis.errors import burst_events, fmt_p
from gate.analysis.policy import Policy
from gate.analysis.types import Check
from gate.core.vocabulary import CheckDecision

__all__ = [
    "EngineSeries",
    "ScenarioTelemetry",
    "block_sign_test",
    "engine_metric_checks",
    "preemption_test",
]


@dataclass(frozen=True)
class EngineSeries:
    """One engine's timeline: scrape times (s), series (NaN: a gap) and its configuration."""

    t_s: np.ndarray
    series: Mapping[str, np.ndarray] = field(default_factory=dict)
    config: Mapping[str, str] = field(default_factory=dict)

    def values(self, metric: str) -> np.ndarray | None:
        """The metric's finite values with their times, or None when it never appeared."""
        v = self.series.get(metric)
        if v is None or not np.isfinite(v).any():
            return None
        return v

    def increase(self, metric: str) -> float | None:
        """A counter's rise over the timeline (restarts counted from zero), or None."""
        v = self.values(metric)
        if v is None:
            return None
        finite = v[np.isfinite(v)]
        steps = np.diff(finite)
        return float(np.where(steps >= 0, steps, finite[1:]).sum()) if finite.size > 1 else 0.0

    def share(self, part: str, whole: str, gauge: str) -> float | None:
        """A rate from two counters, `part`'s rise over `whole`'s where `whole` rose, else
        the mean of the `gauge` the engine states it by (a prefix-cache hit rate, a draft
        acceptance rate); None when it has neither."""
        w, p = self.increase(whole), self.increase(part)
        if w is not None and p is not None and w > 0:
            return p / w
        return self.mean(gauge)

    def rises(self, metric: str) -> np.ndarray | None:
        """Times of the scrapes at which a counter had risen since the scrape before (after
        a restart, which resets it, only where it counted anything again: the drop to zero
        itself is no preemption)."""
        v = self.values(metric)
        if v is None:
            return None
        ok = np.isfinite(v)
        t, finite = self.t_s[ok], v[ok]
        steps = np.diff(finite)
        out: np.ndarray = t[1:][(steps > 0) | ((steps < 0) & (finite[1:] > 0))]
        return out

    def mean(self, metric: str) -> float | None:
        v = self.values(metric)
        return float(np.nanmean(v)) if v is not None else None

    def config_number(self, key: str) -> float | None:
        try:
            return float(self.config[key])
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class ScenarioTelemetry:
    """Both engines' timelines over one load scenario (None: that engine was not sampled)."""

    name: str
    reference: EngineSeries | None
    candidate: EngineSeries | None


def preemption_test(reference: int, candidate: int, tolerance: float) -> tuple[float, float]:
    """(p, p0): the one-sided exact test that the candidate's episodes are no more than
    (1 + tolerance) x the reference's rate, given both engines' episode counts."""
    p0 = (1.0 + tolerance) / (2.0 + tolerance)
    n = reference + candidate
    if candidate == 0 or n == 0:
        return 1.0, p0
    return float(stats.binom.sf(candidate - 1, n, p0)), p0


def block_sign_test(
    reference: EngineSeries, candidate: EngineSeries, block_s: float, tolerance: float
) -> tuple[float, int, int]:
    """(p, blocks where the candidate preempted more, blocks where it preempted fewer): the
    one-sided sign test over time blocks of `block_s` (module docstring)."""
    ends = [s.t_s[-1] for s in (reference, candidate) if s.t_s.size]
    if not ends or block_s <= 0:
        return 1.0, 0, 0
    edges = np.arange(0.0, max(ends) + block_s, block_s)

    def per_block(s: EngineSeries) -> np.ndarray:
        v = s.series["preemptions_total"]
        ok = np.isfinite(v)
        t, x = s.t_s[ok], v[ok]
        rise = np.diff(x, prepend=x[:1])
        rise = np.where(rise >= 0, rise, x)  # a restarted counter counts from zero
        return np.histogram(t, bins=edges, weights=rise)[0]

    r, c = per_block(reference), per_block(candidate)
    more = int((c > (1.0 + tolerance) * r).sum())
    fewer = int((c < r).sum())
    if more == 0:
        return 1.0, more, fewer
    return float(stats.binom.sf(more - 1, more + fewer, 0.5)), more, fewer


def _episodes(series: EngineSeries, window_s: float) -> int | None:
    rises = series.rises("preemptions_total")
    if rises is None:
        return None
    times, _ = burst_events(rises, ["preemption"] * rises.size, window_s)
    return int(times.size)


def _preemption_check(
    sc: ScenarioTelemetry, ref: EngineSeries, cand: EngineSeries, policy: Policy, alpha: float
) -> Check | None:
    pol = policy.engine
    e_ref, e_cand = (
        _episodes(ref, pol.preemption_episode_s),
        _episodes(cand, pol.preemption_episode_s),
    )
    if e_ref is None or e_cand is None:
        return None
    n_ref, n_cand = ref.increase("preemptions_total"), cand.increase("preemptions_total")
    p_ep, p0 = preemption_test(e_ref, e_cand, pol.preemption_tolerance)
    p_bl, more, fewer = block_sign_test(ref, cand, pol.preemption_block_s, pol.preemption_tolerance)
    p = min(p_ep, p_bl)
    counts = (
        f"candidate {n_cand:g} preemptions in {e_cand} episodes, reference {n_ref:g} in "
        f"{e_ref} (episodes: rises less than {pol.preemption_episode_s:g} s apart), "
        f"{fmt_p(p_ep)}; the candidate preempted more in {more} blocks of "
        f"{pol.preemption_block_s:g} s and fewer in {fewer}, {fmt_p(p_bl)}"
    )
    alpha = alpha / 2  # two tests, each with half
    allowed = e_ref * (1.0 + pol.preemption_tolerance)
    if alpha > 0 and p <= alpha:
        decision = "fail"
        words = (
            f"the candidate preempts more than the reference: {counts}; the smaller p <= "
            f"alpha {alpha:.2g} each"
        )
    elif e_cand <= allowed and more <= fewer:
        decision = "pass"
        words = f"no more preemption episodes than the reference: {counts}"
    else:
        decision = "undecided"
        words = (
            f"more preemption episodes than the reference, without evidence yet: {counts}; "
            f"both above alpha {alpha:.2g} each"
        )
    check = statistic_check(
        f"{sc.name}.engine.preemptions",
        "engine",
        "preemptions",
        decision,  # type: ignore[arg-type]
        f"{sc.name}: {words}.",
        scenario=sc.name,
        threshold=p0,
        samples=(e_ref, e_cand),
        alpha=2 * alpha,
        **compared(n_ref, n_cand),
    )
    return replace(check, required=decision != "undecided")


def _capacity(series: EngineSeries) -> tuple[str, float] | None:
    for key in ("kv_cache_tokens", "kv_cache_blocks"):
        v = series.config_number(key)
        if v is not None and v > 0:
            return key, v
    return None


def _config_words(series: EngineSeries) -> str:
    parts = [
        f"{k} {series.config[k]}"
        for k in ("kv_cache_blocks", "block_size", "kv_cache_tokens", "cache_dtype")
        if k in series.config
    ]
    return ", ".join(parts)


def kv_capacity_check(
    scenarios: Sequence[ScenarioTelemetry], policy: Policy, notes: list[str]
) -> list[Check]:
    """The KV cache's size as each engine's metrics state it (tokens, else blocks): a rule."""
    found: dict[str, EngineSeries] = {}
    for sc in scenarios:
        for role, s in (("reference", sc.reference), ("candidate", sc.candidate)):
            if s is not None and role not in found and _capacity(s) is not None:
                found[role] = s
    if len(found) < 2:
        lacking = [r for r in ("reference", "candidate") if r not in found]
        if any(sc.reference or sc.candidate for sc in scenarios):
            notes.append(
                f"KV cache capacity not compared: the {' and '.join(lacking)}'s metrics do not "
                "state it (vLLM's cache_config_info, SGLang's max_total_num_tokens, "
                "TensorRT-LLM's kv_cache_max_blocks)."
            )
        return []
    ref, cand = found["reference"], found["candidate"]
    ref_cap, cand_cap = _capacity(ref), _capacity(cand)
    assert ref_cap is not None and cand_cap is not None
    key = "kv_cache_tokens" if ref_cap[0] == cand_cap[0] == "kv_cache_tokens" else "kv_cache_blocks"
    r, c = ref.config_number(key), cand.config_number(key)
    if r is None or c is None:
        notes.append("KV cache capacity not compared: one engine states tokens, the other blocks.")
        return []
    floor = 1.0 - policy.engine.kv_capacity_tolerance
    unit = "tokens" if key == "kv_cache_tokens" else "blocks"
    fails = c < floor * r
    words = (
        f"KV cache capacity: candidate {c:g} {unit}, reference {r:g} "
        f"(ratio {c / r:.3g}, at least {floor:g} allowed); candidate {_config_words(cand)}; "
        f"reference {_config_words(ref)}."
    )
    if fails:
        words = "The candidate's KV cache is smaller: it preempts sooner at a peak. " + words
    return [
        rule_check(
            "engine.kv_capacity",
            "engine",
            "kv_cache_capacity",
            "fail" if fails else "pass",
            words,
            threshold=floor,
            **compared(r, c),
        )
    ]


def _hit_rate(s: EngineSeries) -> float | None:
    return s.share("prefix_cache_hits_total", "prefix_cache_queries_total", "prefix_cache_hit_rate")


def _prefix_check(
    sc: ScenarioTelemetry, ref: EngineSeries, cand: EngineSeries, policy: Policy, notes: list[str]
) -> Check | None:
    r, c = _hit_rate(ref), _hit_rate(cand)
    if r is not None and c is None and cand.increase("prefix_cache_queries_total") == 0.0:
        # It exports the counter but looked nothing up while the reference did: its prefix
        # cache is off (vLLM records no lookup then: vllm/v1/core/kv_cache_manager.py
        # get_computed_blocks returns before record_prefix_cache_stats), so it hit nothing.
        c = 0.0
    if r is None or c is None:
        if r is not None or c is not None:
            who = "candidate" if c is None else "reference"
            notes.append(
                f"{sc.name}: prefix-cache hit rate not compared: the {who} does not export it."
            )
        return None
    pol = policy.engine
    if r < pol.prefix_cache_min_rate:
        notes.append(
            f"{sc.name}: prefix-cache hit rate not compared: the reference hit {r:.1%} (under "
            f"{pol.prefix_cache_min_rate:.0%}), so these prompts share no prefix worth caching."
        )
        return None
    fails = c < r - pol.prefix_cache_tolerance
    return rule_check(
        f"{sc.name}.engine.prefix_cache_hit_rate",
        "engine",
        "prefix_cache_hit_rate",
        "fail" if fails else "pass",
        f"{sc.name}: prefix-cache hit rate candidate {c:.1%}, reference {r:.1%} (at most "
        f"{pol.prefix_cache_tolerance:.0%} points lower allowed).",
        scenario=sc.name,
        threshold=r - pol.prefix_cache_tolerance,
        **compared(r, c),
    )


def _acceptance(s: EngineSeries) -> float | None:
    return s.share(
        "spec_decode_accepted_tokens_total",
        "spec_decode_draft_tokens_total",
        "spec_decode_acceptance_rate",
    )


def _spec_check(
    sc: ScenarioTelemetry, ref: EngineSeries, cand: EngineSeries, policy: Policy, notes: list[str]
) -> Check | None:
    r, c = _acceptance(ref), _acceptance(cand)
    if r is None or c is None:
        if r is not None:
            notes.append(
                f"{sc.name}: spec-decode acceptance not compared: the reference drafts, the "
                "candidate exports no acceptance."
            )
        return None
    floor = (1.0 - policy.engine.spec_decode_tolerance) * r
    fails = c < floor
    return rule_check(
        f"{sc.name}.engine.spec_decode_acceptance",
        "engine",
        "spec_decode_acceptance",
        "fail" if fails else "pass",
        f"{sc.name}: speculative tokens accepted: candidate {c:.1%}, reference {r:.1%} (at "
        f"least {floor:.1%} allowed).",
        scenario=sc.name,
        threshold=floor,
        **compared(r, c),
    )


def _queue_check(
    sc: ScenarioTelemetry, ref: EngineSeries, cand: EngineSeries, policy: Policy
) -> Check | None:
    r, c = ref.mean("requests_waiting"), cand.mean("requests_waiting")
    if r is None or c is None:
        return None
    pol = policy.engine
    limit = (1.0 + pol.queue_tolerance) * r + pol.queue_slack
    decision: CheckDecision = "fail" if c > limit else "pass"
    said = f"at most {limit:.2f} allowed"
    if r > pol.queue_slack and decision == "fail":
        # The reference queues too: near saturation each engine's queue is a random walk of
        # its own under the same arrivals, and a rule without a noise model would hold A/A
        # gates (review: 8% of A/A gates at load 1.0 in a toy model). Not shown; the latency
        # and saturation checks judge a candidate that saturates first.
        decision = "undecided"
        said += "; the reference queues too, so two saturated queues are not judged by rule"
    return rule_check(
        f"{sc.name}.engine.queue_depth",
        "engine",
        "requests_waiting",
        decision,
        f"{sc.name}: mean queue under the same load: candidate {c:.2f} requests waiting, "
        f"reference {r:.2f} ({said}).",
        scenario=sc.name,
        threshold=limit,
        **compared(r, c),
    )


def engine_metric_checks(
    scenarios: Sequence[ScenarioTelemetry], policy: Policy, notes: list[str]
) -> list[Check]:
    """Every engine check of the gate (module docstring); what is missing goes to `notes`."""
    both = [sc for sc in scenarios if sc.reference is not None and sc.candidate is not None]
    for sc in scenarios:
        if sc not in both:
            lacking = [
                r
                for r, s in (("reference", sc.reference), ("candidate", sc.candidate))
                if s is None
            ]
            notes.append(f"{sc.name}: no engine metrics from the {' and '.join(lacking)}.")
    counted = [
        sc
        for sc in both
        if sc.reference
        and sc.reference.values("preemptions_total") is not None
        and sc.candidate
        and sc.candidate.values("preemptions_total") is not None
    ]
    alpha = policy.group_alpha("engine") / len(counted) if counted else 0.0
    if counted and alpha <= 0:
        notes.append("Preemptions compared without a test: alpha_split gives `engine` nothing.")
    checks: list[Check] = []
    for sc in both:
        ref, cand = sc.reference, sc.candidate
        assert ref is not None and cand is not None
        pre = _preemption_check(sc, ref, cand, policy, alpha)
        if pre is None:
            notes.append(f"{sc.name}: preemptions not compared: an engine does not export them.")
        for check in (
            pre,
            _prefix_check(sc, ref, cand, policy, notes),
            _spec_check(sc, ref, cand, policy, notes),
            _queue_check(sc, ref, cand, policy),
        ):
            if check is not None:
                checks.append(check)
    checks.extend(kv_capacity_check(both, policy, notes))
    return checks
