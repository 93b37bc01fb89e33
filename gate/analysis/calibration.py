"""Calibration by simulation: how often each judge holds a good candidate, and how fast it holds
a bad one, on the same simulated gates.

References:
    statistics.md, "Experimental design matters more than the test" (calibrate with A/A runs and
    injected regressions; report hold probability and median requests to hold).
    M. Lindon, C. Sanden and V. Shirikian, "Rapid regression detection in software deployments
    through sequential testing", KDD 2022 (the same exercise for Netflix's canaries).

Why simulate: 50 real A/A runs only bound the false-hold rate at ~6% (rule of three), and real
regressions of known size are rare. A simulated gate is a pure function of a seed, so both
judges see exactly the same data and many thousand gates fit in minutes.

The simulated gate itself (engines, injected cases, logits) is calibration_sim.py.

Our judge looks every `look_every` requests per arm up to `limit` with the plan fixed in advance
(sequential.py), and on past it up to the policy's `extend` when a check is still undecided
there (the simulated engines keep serving); divergence is judged at the first look (it does not
depend on the load), a crash at the first look after it. The baseline (baseline.py) judges
TTFT, ITL, the error rate per block of 100 requests and the per-prompt mean |delta logp|
against the envelope every `baseline_every` requests and at the limit, on everything so far,
and its repeated looks count as Kayenta's do.

Our verdict holds when a check failed (`fail_rate`) or, at the limit, when a check is still
inconclusive (`inconclusive_rate`): `hold_rate` is their sum, the fraction of gates whose verdict
is hold. On A/A data every hold is a false hold to the user (`aa_false_hold_rate`, the A/A
hold rate); its two parts are reported beside it: checks that failed (`aa_failed_rate`, the
statistical false alarms that alpha bounds) and checks still inconclusive at the limit
(`aa_inconclusive_rate`, the price of too few samples, which the extension lowers). A hold for
an inconclusive check happens at the limit, and counts there for the median requests to hold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gate.analysis.baseline import judge_baseline
from gate.analysis.calibration_sim import (
    ERROR_MIX,
    Case,
    DependenceModel,
    SimConfig,
    SimulatedArm,
    SimulatedGate,
    simulated_gate,
)
from gate.analysis.divergence import divergence_checks, teacher_stats
from gate.analysis.plan import Plan
from gate.analysis.policy import Policy
from gate.analysis.sequential import SequentialJudge
from gate.analysis.types import ArmSamples

__all__ = [
    "CASES",
    "GRID_CASES",
    "GRID_SIZES",
    "MODELS",
    "Case",
    "CaseResult",
    "DependenceModel",
    "GateOutcome",
    "GridCell",
    "SimConfig",
    "calibrate",
    "calibrate_each",
    "calibrate_grid",
    "cases_named",
    "simulate_gate",
]

MODELS: tuple[DependenceModel, ...] = (
    DependenceModel("independent-like", 0.0, 0.10, 8, 0.28),
    DependenceModel("mirrored", 0.35, 0.05, 8, 0.10),
    DependenceModel("itl-like", 0.23, 0.08, 16, 0.03),
    DependenceModel("heavy-batch", 0.0, 0.173, 32, 0.245),
)
GRID_SIZES: tuple[int, ...] = (500, 1_000, 2_000, 20_000)

AA = Case("A/A")
CASES: tuple[Case, ...] = (
    AA,
    Case("TTFT x1.05", ttft=1.05),
    Case("TTFT x1.10", ttft=1.10),
    Case("TTFT x1.20", ttft=1.20),
    Case("tail >p95 x1.15", tail=1.15),
    Case("tail >p95 x1.30", tail=1.30),
    Case("ITL x1.10", itl=1.10),
    Case("errors x2", errors=2.0),
    Case("errors x5", errors=5.0),
    Case("benign logit noise", divergence="benign"),
    Case("numerical bug", divergence="bug"),
    Case("candidate crash", crash=True),
)
_BY_NAME = {case.name: case for case in CASES}


def cases_named(*names: str) -> tuple[Case, ...]:
    """Cases of CASES by name, in the order given: one declaration per injected case, which
    the grid and the shapes' power rows pick from."""
    return tuple(_BY_NAME[name] for name in names)


@dataclass(frozen=True)
class GateOutcome:
    """One simulated gate. failed: a check of ours failed; inconclusive: ours held at the limit
    only on checks still undecided; requests: requests per arm when ours held (the limit for an
    inconclusive hold); baseline_*: the same for the baseline (it has no inconclusive)."""

    failed: bool
    inconclusive: bool
    requests: int | None
    baseline_held: bool
    baseline_requests: int | None
    stopped: int = 0
    baseline_stopped: int = 0

    @property
    def held(self) -> bool:
        return self.failed or self.inconclusive


@dataclass(frozen=True)
class CaseResult:
    """Rates over the runs of one case (module docstring); medians over the runs that held,
    None when none did; *_10k: held at or before 10,000 requests per arm."""

    name: str
    runs: int
    hold_rate: float
    fail_rate: float
    inconclusive_rate: float
    hold_rate_10k: float
    median_requests_to_hold: float | None
    baseline_hold_rate: float
    baseline_hold_rate_10k: float
    baseline_median_requests_to_hold: float | None
    median_requests_to_verdict: float | None = None
    p90_requests_to_verdict: float | None = None
    baseline_median_requests_to_verdict: float | None = None
    baseline_p90_requests_to_verdict: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "runs": self.runs,
            "hold_rate": self.hold_rate,
            "fail_rate": self.fail_rate,
            "inconclusive_rate": self.inconclusive_rate,
            "hold_rate_10k": self.hold_rate_10k,
            "median_requests_to_hold": self.median_requests_to_hold,
            "baseline_hold_rate": self.baseline_hold_rate,
            "baseline_hold_rate_10k": self.baseline_hold_rate_10k,
            "baseline_median_requests_to_hold": self.baseline_median_requests_to_hold,
            "median_requests_to_verdict": self.median_requests_to_verdict,
            "p90_requests_to_verdict": self.p90_requests_to_verdict,
            "baseline_median_requests_to_verdict": self.baseline_median_requests_to_verdict,
            "baseline_p90_requests_to_verdict": self.baseline_p90_requests_to_verdict,
        }


def _samples(arm: SimulatedArm, sent: np.ndarray, t: int) -> ArmSamples:
    ttft = arm.ttft[:t]
    ok = ~np.isnan(ttft)  # successes and timeouts (censored at the timeout)
    itl = arm.itl[:t]
    ok_itl = ~np.isnan(itl)
    ids = np.arange(t)
    err = arm.error[:t]
    failed = err >= 0
    kinds = [ERROR_MIX[e][0] for e in err[failed]]
    counts: dict[str, int] = {}
    for kd in kinds:
        counts[kd] = counts.get(kd, 0) + 1
    return ArmSamples(
        requests=t,
        ttft_ms=ttft[ok],
        itl_ms=itl[ok_itl],
        errors=counts,
        error_offsets_s=sent[:t][failed],
        error_kinds=tuple(kinds),
        ids={"ttft": ids[ok], "itl": ids[ok_itl]},
        error_ids=ids[failed],
    )


def _ours(
    gate: SimulatedGate, plan: Plan, policy: Policy, config: SimConfig
) -> tuple[bool, bool, int | None, int]:
    """(failed, held on an undecided required check, requests per arm at the hold, requests
    per arm at the verdict)."""
    judge = SequentialJudge(plan)
    notes: list[str] = []
    diverged = gate.divergence is not None and any(
        c.decision == "fail" for c in divergence_checks(gate.divergence, policy, notes)
    )
    step = policy.look_every
    limit = plan.limit("steady")
    looks = list(range(step, limit + 1, step))
    if looks[-1] != limit:
        looks.append(limit)
    for t in looks:
        if diverged or (gate.crash_at is not None and gate.crash_at <= t):
            return True, False, t, t
        look = judge.look(
            "steady", _samples(gate.ref, gate.sent, t), _samples(gate.cand, gate.sent, t)
        )
        if look.hold:
            return True, False, t, t
        if look.stop:
            if any(c.holds for c in look.checks):
                return False, True, t, t
            return False, False, None, t
    return False, False, None, looks[-1]


def _block_error_rates(error: np.ndarray, block: int = 100) -> np.ndarray:
    n = error.size // block
    return np.asarray((error[: n * block] >= 0).reshape(n, block).mean(axis=1), dtype=np.float64)


def _baseline(gate: SimulatedGate, config: SimConfig, k: int) -> tuple[bool, int | None]:
    div = gate.divergence
    env = np.array(
        [teacher_stats(p, k).mean_abs_dlogp for p in div.envelope_teacher] if div else []
    )
    cand_div = np.array([teacher_stats(p, k).mean_abs_dlogp for p in div.teacher] if div else [])
    looks = list(range(config.baseline_every, config.limit + 1, config.baseline_every))
    if not looks or looks[-1] != config.limit:
        looks.append(config.limit)  # the run's end is always a Kayenta interval
    intervals = []
    for t in looks:
        # A crashed canary sends no more data: Kayenta judges what it had.
        tc = t if gate.crash_at is None else min(t, gate.crash_at)
        # Kayenta reads successful requests only: a timed-out one is not a latency sample.
        ref_ttft = np.where(gate.ref.censored[:t], np.nan, gate.ref.ttft[:t])
        cand_ttft = np.where(gate.cand.censored[:tc], np.nan, gate.cand.ttft[:tc])
        intervals.append(
            {
                "ttft": (cand_ttft[~np.isnan(cand_ttft)], ref_ttft[~np.isnan(ref_ttft)]),
                "itl": (
                    gate.cand.itl[:tc][~np.isnan(gate.cand.itl[:tc])],
                    gate.ref.itl[:t][~np.isnan(gate.ref.itl[:t])],
                ),
                "errors": (
                    _block_error_rates(gate.cand.error[:tc]),
                    _block_error_rates(gate.ref.error[:t]),
                ),
                **({"divergence": (cand_div, env)} if div is not None else {}),
            }
        )
    result = judge_baseline(intervals)
    if not result.held or result.look is None:
        return False, None
    return True, looks[result.look]


def simulate_gate(
    case: Case, policy: Policy, config: SimConfig, seed: int | np.random.SeedSequence
) -> GateOutcome:
    """Both judges on one simulated gate (module docstring)."""
    rng = np.random.default_rng(seed)
    k = policy.divergence.top_k
    sized = Plan.build(policy, {"steady": config.limit}, short_ok={"steady"})
    gate = simulated_gate(case, config, k, rng, sized.limit("steady"))
    # Blocks in time: the schedule's send offsets are known before the load.
    plan = Plan.build(
        policy, {"steady": config.limit}, times={"steady": gate.sent}, short_ok={"steady"}
    )
    failed, inconclusive, requests, stopped = _ours(gate, plan, policy, config)
    b_held, b_requests = _baseline(gate, config, k)
    b_stopped = b_requests if b_held and b_requests is not None else config.limit
    return GateOutcome(failed, inconclusive, requests, b_held, b_requests, stopped, b_stopped)


def _median(values: Sequence[int]) -> float | None:
    return float(np.median(values)) if values else None


def _p90(values: Sequence[int]) -> float | None:
    return float(np.quantile(values, 0.9)) if values else None


@dataclass(frozen=True)
class Calibration:
    """Every case's rates; the A/A case is both in `cases` and summarised at the top."""

    alpha: float
    runs: int
    limit: int
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)

    @property
    def aa(self) -> CaseResult | None:
        return next((c for c in self.cases if c.name == AA.name), None)

    def to_dict(self) -> dict[str, object]:
        aa = self.aa
        return {
            "alpha": self.alpha,
            "runs": self.runs,
            "limit": self.limit,
            "aa_false_hold_rate": None if aa is None else aa.hold_rate,
            "aa_failed_rate": None if aa is None else aa.fail_rate,
            "aa_inconclusive_rate": None if aa is None else aa.inconclusive_rate,
            "baseline_aa_false_hold_rate": None if aa is None else aa.baseline_hold_rate,
            "cases": [c.to_dict() for c in self.cases],
        }


def calibrate(
    policy: Policy,
    runs: int,
    seed: int = 0,
    config: SimConfig | None = None,
    cases: Sequence[Case] = CASES,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Simulate `runs` gates per case; gate r of every case uses the same seed stream r, so
    the cases differ only by what was injected."""
    config = config or SimConfig()
    if config.limit % policy.look_every:
        config = replace(config, limit=(config.limit // policy.look_every) * policy.look_every)
    root = np.random.SeedSequence(seed)
    seeds = root.spawn(runs)
    results = []
    for case in cases:
        outcomes = []
        for r in range(runs):
            outcomes.append(simulate_gate(case, policy, config, seeds[r]))
            if progress is not None:
                progress(case.name)
        held = [o.requests for o in outcomes if o.held and o.requests is not None]
        b_held = [o.baseline_requests for o in outcomes if o.baseline_held and o.baseline_requests]
        results.append(
            CaseResult(
                name=case.name,
                runs=runs,
                hold_rate=sum(o.held for o in outcomes) / runs,
                fail_rate=sum(o.failed for o in outcomes) / runs,
                inconclusive_rate=sum(o.inconclusive for o in outcomes) / runs,
                hold_rate_10k=sum(r <= 10_000 for r in held) / runs,
                median_requests_to_hold=_median(held),
                baseline_hold_rate=len(b_held) / runs,
                baseline_hold_rate_10k=sum(r <= 10_000 for r in b_held) / runs,
                baseline_median_requests_to_hold=_median(b_held),
                median_requests_to_verdict=_median([o.stopped for o in outcomes]),
                p90_requests_to_verdict=_p90([o.stopped for o in outcomes]),
                baseline_median_requests_to_verdict=_median([o.baseline_stopped for o in outcomes]),
                baseline_p90_requests_to_verdict=_p90([o.baseline_stopped for o in outcomes]),
            )
        )
    return Calibration(alpha=policy.alpha, runs=runs, limit=config.limit, cases=tuple(results))


def calibrate_each(
    policy: Policy,
    runs: int,
    config: SimConfig,
    cases: Sequence[Case],
    *,
    seed: int = 0,
    aa_runs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """`calibrate` case by case, each on its own number of gates: the A/A case on `aa_runs`
    (default `runs`), whose false-hold rate needs the most; the whole is labelled `runs`."""
    parts: list[CaseResult] = []
    for case in cases:
        n = aa_runs if case == AA and aa_runs is not None else runs
        parts.extend(
            calibrate(policy, n, seed=seed, config=config, cases=[case], progress=progress).cases
        )
    return Calibration(policy.alpha, runs, config.limit, tuple(parts))


GRID_CASES: tuple[Case, ...] = cases_named(
    "A/A", "TTFT x1.10", "TTFT x1.20", "ITL x1.10", "tail >p95 x1.30", "errors x2"
)


@dataclass(frozen=True)
class GridCell:
    """One dependence model at one planned size: every grid case on the same seeds."""

    model: DependenceModel
    limit: int
    calibration: Calibration
    errors: str | None = None  # an errors cell: its error model, e.g. "1% in bursts of 4"

    def to_dict(self) -> dict[str, object]:
        m = self.model
        return {
            "model": m.name,
            "errors": self.errors,
            "common_sd": m.common,
            "batch_sd": m.batch_sd,
            "batch": m.batch,
            "own_sd": m.own,
            **self.calibration.to_dict(),
        }


def calibrate_grid(
    policy: Policy,
    runs: int,
    seed: int = 0,
    models: Sequence[DependenceModel] = MODELS,
    sizes: Sequence[int] = GRID_SIZES,
    cases: Sequence[Case] = GRID_CASES,
    aa_runs: int | None = None,
    progress: Callable[[str], None] | None = None,
    errors_size: int | None = 5_000,
) -> list[GridCell]:
    """Latency and error cases on each dependence model at each planned size (issue 17).

    The engines keep the default error rate (0.5%) in bursts of 4 simultaneous failures, so
    every A/A cell also checks that bursts on both sides are not held. Divergence is not
    simulated here (it does not depend on the load; the default calibration covers it).
    aa_runs: gates of the A/A case (default `runs`), whose false-hold rate needs the most.
    errors_size: also two errors cells at this planned size (None: none) on the mirrored
    model: a 1% base error rate doubled, independent and in bursts of 4 (A/A and errors x2).
    """
    cells = []
    for model in models:
        for size in sizes:
            config = replace(
                SimConfig().with_model(model), limit=size, error_burst=4, divergence=False
            )
            result = calibrate_each(
                policy, runs, config, cases, seed=seed, aa_runs=aa_runs, progress=progress
            )
            cells.append(GridCell(model, size, result))
    if errors_size is not None:
        model = MODELS[1]
        for burst in (1, 4):
            config = replace(
                SimConfig().with_model(model),
                limit=errors_size,
                error_rate=0.01,
                error_burst=burst,
                divergence=False,
            )
            result = calibrate_each(
                policy,
                runs,
                config,
                cases_named("A/A", "errors x2"),
                seed=seed,
                aa_runs=aa_runs,
                progress=progress,
            )
            label = "1%, independent" if burst == 1 else f"1% in bursts of {burst}"
            cells.append(GridCell(model, errors_size, result, errors=label))
    return cells
