"""GPU checks: what each engine's GPUs did under the same mirrored load (pure; the timelines
come from gate/telemetry through the run or the stored document).

Both engines serve the same schedule at the same instants, so their GPUs are compared over the
same work; each check is a rule with a tolerance in the policy (`policy.gpu`), not a test: a
gate has one run of each engine, and what varies between runs of one engine (a few percent of
power, a few hundred MiB of memory as allocators round) is what the tolerance absorbs.

    gpu.memory            peak GPU memory: the largest sum over the engine's GPUs of memory used
                          at any read of any load scenario; the candidate/reference ratio holds
                          above 1 + policy.gpu.memory_tolerance. An engine that reserves memory
                          up front (vLLM's gpu_memory_utilization) shows it from the first read.
    gpu.energy_per_token  energy over the load scenarios divided by the output tokens served
                          in them: from the energy counter where every read has one (NVML, DCGM:
                          the counter's rise), else the power integrated over time (trapezoids
                          between reads: nvidia-smi has no counter); in each scenario over the
                          same span for both engines (the later first read to the earlier
                          last), so neither is charged idle power the other's span left out.
                          Integrated from power, each side needs MIN_POWER_READS readings in
                          that span, else a note says how few it had and no check is made.
                          The ratio holds above 1 + policy.gpu.energy_tolerance. Idle power
                          counts too: an engine that is slower for the same tokens spends more
                          energy on them.
    gpu.xid               XID errors (the driver's reports of GPU faults) on the candidate's
                          GPUs alone hold; on both engines' they are the test bed's (a warning
                          that the GPUs or the driver are unwell, no claim about the candidate).

Where neither engine's GPUs were read (no GPU visible, telemetry off, attached engines), the
reason is one note and no GPU check is made; where only one engine's were, a note says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gate.analysis.checks import compared, rule_check
from gate.analysis.policy import Policy
from gate.analysis.types import Check
from gate.core.vocabulary import Role

GIB = 1024.0**3


@dataclass(frozen=True)
class GpuSeries:
    """One engine's GPUs through one scenario: per read, seconds into the scenario, memory used
    (bytes), power (W) and the energy counter (J; None where the source has none), summed over
    the engine's GPUs; the XID errors reported in the scenario and the last one's code; the
    output tokens it served in the scenario."""

    t_s: tuple[float, ...]
    memory_bytes: tuple[float | None, ...]
    power_w: tuple[float | None, ...]
    energy_j: tuple[float | None, ...]
    xid_count: int = 0
    xid_last: int | None = None
    output_tokens: int = 0

    def peak_memory(self) -> float | None:
        known = [m for m in self.memory_bytes if m is not None]
        return max(known) if known else None

    def counted(self) -> list[tuple[float, float]] | None:
        """The energy counter's reads (seconds, J) where the counter can be read as a rise:
        its first and last reads present and never going back (a driver reload resets it);
        None: integrate power instead."""
        if self.energy_j[0] is None or self.energy_j[-1] is None:
            return None
        e = [(t, v) for t, v in zip(self.t_s, self.energy_j, strict=True) if v is not None]
        if any(b < a for (_, a), (_, b) in itertools.pairwise(e)):
            return None
        return e

    def power_reads(self, span: tuple[float, float]) -> int:
        """How many power readings were made inside `span` (its ends included)."""
        t0, t1 = span
        return sum(
            1
            for t, w in zip(self.t_s, self.power_w, strict=True)
            if w is not None and t0 - 1e-9 <= t <= t1 + 1e-9
        )

    def energy(self, span: tuple[float, float] | None = None) -> float | None:
        """Joules spent over `span` (seconds into the scenario; default: from the first read
        to the last): the counter's rise, else power integrated. Reads that failed (None) are
        bridged, not dropped: the counter is interpolated across them, and power is
        interpolated across them and held flat before its first and after its last reading,
        so a side with a gap in its reads is not credited with less energy than the other for
        the same span."""
        if len(self.t_s) < 2:
            return None
        t0, t1 = span if span is not None else (self.t_s[0], self.t_s[-1])
        e = self.counted()
        if e is not None:
            ts, vs = [t for t, _ in e], [v for _, v in e]
            return float(np.interp(t1, ts, vs) - np.interp(t0, ts, vs))
        p = [(t, w) for t, w in zip(self.t_s, self.power_w, strict=True) if w is not None]
        if len(p) < 2:
            return None
        # power is piecewise linear between its reads and flat outside them: the trapezoids
        # over the span's ends and every read inside it are its exact integral
        pt, pw = [t for t, _ in p], [w for _, w in p]
        grid = np.array([t0, *(t for t in pt if t0 < t < t1), t1])
        watts = np.interp(grid, pt, pw)
        return float(np.sum((watts[1:] + watts[:-1]) / 2.0 * np.diff(grid)))


@dataclass(frozen=True)
class GpuScenario:
    """Both engines' GPU series in one scenario (None: not read), and why one is missing."""

    name: str
    reference: GpuSeries | None
    candidate: GpuSeries | None
    note: str | None = None


def _peak(series: Sequence[GpuSeries]) -> float | None:
    peaks = [p for s in series if (p := s.peak_memory()) is not None]
    return max(peaks) if peaks else None


def _memory_check(both: Sequence[GpuScenario], policy: Policy, notes: list[str]) -> list[Check]:
    ref = _peak([s.reference for s in both if s.reference is not None])
    cand = _peak([s.candidate for s in both if s.candidate is not None])
    if ref is None or cand is None or ref <= 0:
        notes.append("GPU memory was not compared: a side's GPUs reported no memory in use.")
        return []
    return [
        _ratio_rule(
            "gpu.memory",
            "peak_memory_gib",
            (ref / GIB, cand / GIB),
            1.0 + policy.gpu.memory_tolerance,
            f"peak GPU memory: the candidate's {cand / GIB:.2f} GiB against the reference's "
            f"{ref / GIB:.2f} GiB",
            "the candidate needs more GPU memory than the tolerance allows",
        )
    ]


def _ratio_rule(
    id: str,
    metric: str,
    values: tuple[float, float],
    limit: float,
    said: str,
    why: str,
    samples: tuple[int, int] = (0, 0),
) -> Check:
    """candidate / reference against 1 + tolerance: a rule (no noise model; docs/statistics.md)."""
    ref, cand = values
    failed = cand / ref > limit
    said += f" (x{cand / ref:.3f}; tolerance x{limit:.3f})"
    return rule_check(
        id,
        "gpu",
        metric,
        "fail" if failed else "pass",
        f"{said}: {why}." if failed else said + ".",
        threshold=limit,
        samples=samples,
        **compared(ref, cand),
    )


def _common_span(s: GpuScenario) -> tuple[float, float] | None:
    """The instants both engines' GPUs were read over in a scenario: from the later first read
    to the earlier last. Each side's reads are stamped when they were made (the sampler reads
    the engines one after the other), so on a busy host one side's span can be seconds longer
    than the other's: over its own span it would be charged that much more idle power."""
    r, c = s.reference, s.candidate
    if r is None or c is None or not r.t_s or not c.t_s:
        return None
    t0, t1 = max(r.t_s[0], c.t_s[0]), min(r.t_s[-1], c.t_s[-1])
    return (t0, t1) if t1 > t0 else None


def _per_token(both: Sequence[GpuScenario], role: Role) -> tuple[float | None, int]:
    """One engine's energy per output token over the load scenarios, each over the span both
    engines were read in (its own span where they share none)."""
    total, tokens = 0.0, 0
    for s in both:
        series = s.reference if role == "reference" else s.candidate
        if series is None:
            continue
        e = series.energy(_common_span(s))
        if e is None:
            return None, 0
        total += e
        tokens += series.output_tokens
    if not tokens:
        return None, tokens
    return total / tokens, tokens


MIN_POWER_READS = 5
"""Power readings an engine needs inside a scenario's common span before its energy is
integrated from power (no counter): four intervals. Power is an average over about the last
second (NVML's on Ampere and newer), so between two reads seconds apart the integral
guesses; in one CI run two sims read through a stand-in nvidia-smi (a process per read, on a
host whose cores real vLLM held) gave an A/A ratio of 0.58 over 4 s of load, and a memory
regression also held on energy per token. Too few reads is said, not judged."""


def _sparse_power(both: Sequence[GpuScenario], role: Role) -> str | None:
    """Why `role`'s energy cannot be integrated from its power reads, if it cannot: a scenario
    where it has no counter and fewer than MIN_POWER_READS readings inside the common span."""
    for s in both:
        series = s.reference if role == "reference" else s.candidate
        span = _common_span(s)
        if series is None or span is None or series.counted() is not None:
            continue
        reads = series.power_reads(span)
        if reads < MIN_POWER_READS:
            return (
                f"the {role}'s GPU power was read {reads} time(s) in the {span[1] - span[0]:.1f} s "
                f"of scenario {s.name} over which both engines' GPUs were read, and without an "
                f"energy counter (nvidia-smi has none) power is integrated from at least "
                f"{MIN_POWER_READS} reads; a longer scenario or a shorter telemetry interval_s "
                "gives more"
            )
    return None


def _energy_check(both: Sequence[GpuScenario], policy: Policy, notes: list[str]) -> list[Check]:
    sparse = _sparse_power(both, "reference") or _sparse_power(both, "candidate")
    if sparse is not None:
        notes.append(f"Energy per output token was not compared: {sparse}.")
        return []
    ref, ref_tokens = _per_token(both, "reference")
    cand, cand_tokens = _per_token(both, "candidate")
    if ref is None or cand is None or ref <= 0:
        notes.append(
            "Energy per output token was not compared: a side has no energy counter or power "
            "readings over a scenario, or served no output tokens."
        )
        return []
    return [
        _ratio_rule(
            "gpu.energy_per_token",
            "energy_per_token_j",
            (ref, cand),
            1.0 + policy.gpu.energy_tolerance,
            f"energy per output token: the candidate's {cand:.4g} J against the reference's "
            f"{ref:.4g} J",
            "the candidate spends more energy per token than the tolerance allows",
            samples=(ref_tokens, cand_tokens),
        )
    ]


def _xid_check(both: Sequence[GpuScenario]) -> Check:
    ref = sum(s.reference.xid_count for s in both if s.reference is not None)
    cand = sum(s.candidate.xid_count for s in both if s.candidate is not None)
    codes = sorted({c for s in both if s.candidate is not None and (c := s.candidate.xid_last)})
    if cand and not ref:
        last = f" (the last: XID {', '.join(str(c) for c in codes)})" if codes else ""
        return rule_check(
            "gpu.xid",
            "gpu",
            "xid_errors",
            "fail",
            f"{cand} XID error(s) on the candidate's GPUs{last} and none on the reference's "
            "under the same load: the candidate faulted its GPUs.",
            **compared(0.0, float(cand)),
        )
    if cand and ref:
        both_said = (
            f"XID errors on both engines' GPUs ({ref} on the reference's, {cand} on the "
            "candidate's): the GPUs or their driver are unwell, which says nothing of the "
            "candidate."
        )
        check = rule_check(
            "gpu.xid",
            "gpu",
            "environment",
            "undecided",
            both_said,
            **compared(float(ref), float(cand)),
        )
        return replace(check, required=False, warning=both_said)
    return rule_check(
        "gpu.xid",
        "gpu",
        "xid_errors",
        "pass",
        "No XID error on the candidate's GPUs"
        + (f" ({ref} on the reference's)." if ref else " or the reference's."),
        **compared(float(ref), 0.0),
    )


def gpu_checks(scenarios: Sequence[GpuScenario], policy: Policy, notes: list[str]) -> list[Check]:
    """The GPU checks over the load scenarios (module docstring); notes for what was not read."""
    for said in dict.fromkeys(s.note for s in scenarios if s.note):
        notes.append(said)
    both = [s for s in scenarios if s.reference is not None and s.candidate is not None]
    one = [s.name for s in scenarios if (s.reference is None) != (s.candidate is None)]
    if one:
        notes.append(
            f"Only one engine's GPUs were read in {', '.join(one)}: those scenarios are left "
            "out of the GPU checks."
        )
    if not both:
        return []
    return [
        *_memory_check(both, policy, notes),
        *_energy_check(both, policy, notes),
        _xid_check(both),
    ]
