"""Engine facts: crashes, restarts, OOM, and startup (ready time and each phase).

Reference:
    B. L. Welch, "The generalization of 'Student's' problem when several different population
    variances are involved", Biometrika 34(1/2), 1947.

A crash, a restart or an out-of-memory is not a statistic: each holds (statistics.md), and a
reference that does any of them voids the comparison.

Startup is observed once per launch. With one launch per engine there is no launch-to-launch
variance to test against, so each phase (and launch-to-ready) gets a rule: the candidate may
take (1 + startup_tolerance) x the reference's duration plus a slack (startup_slack_s for the
whole launch, startup_phase_slack_s per phase). The tolerance absorbs the jitter of slow phases
(loading weights from a cold cache), the slack that of fast ones (a health check that lands
on a one-second poll). When the gate launched each engine several times (phases given as lists,
two or more per engine), a phase is tested instead: Welch's one-sided t-test of
H0: mean(candidate) <= (1 + tol) mean(reference) + slack, at the startup budget split over the
phases tested. It fails on evidence, passes when the candidate's mean is within the allowance,
and is inconclusive (a hold) when the mean is above the allowance but a few launches cannot
show it. With one launch on one side and several on the other, the rule compares the single
value with the other side's median.

Engines launched as processes on the gate's host share its CPUs with whatever else runs there.
Over each launch (to the end of its start, not its warm-up) the gate measures how much of the
host's CPUs other work kept busy (`EngineFacts.launch_host_busy`) and W, the longest any one
thread of the engine waited for a CPU (`launch_cpu_wait_s`; the keeper's own threads left out).
When the busy share is at least `startup_host_busy`, part of that launch may be the other
work's, and W is how much, as a heuristic: a thread off the critical path can wait without
delaying anything (W too high), a critical path that moves between threads waits more than
any one of them (W too low). So:

* the allowance of every launch rule is computed from the reference's time less its W when
  its launch was busy (never more lenient than without the guard);
* the phase rules the candidate fails share its W: when together they fail by no more than W
  (and each by no more than the busy share of its own duration), each is not shown
  (undecided, not required: a continue lists it); otherwise each stands, saying the wait was
  not enough to explain it. Launch to ready is the phases together and is judged the same way
  on its own;
* a rule the candidate passes only thanks to the reference's wait is not shown.

The warm-up phases (`warmup_done`, `ready`) are outside the measured launch and keep their
rules. The engines' own CPU time is not "other work", but W counts waits for any CPU, the
engine's own threads' included: a candidate that oversubscribes its own threads on a host
that others keep busy can be excused up to that wait (docs/statistics.md, "Where the guarantee
is weakest").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from scipy.stats import t as student_t

from gate.analysis.checks import rule_check, statistic_check
from gate.analysis.policy import Policy
from gate.analysis.types import Check, Decision, EngineFacts

__all__ = ["crash_checks", "startup_checks"]


def _pair(engines: Sequence[EngineFacts]) -> tuple[EngineFacts | None, EngineFacts | None]:
    ref = next((e for e in engines if e.role == "reference"), None)
    cand = next((e for e in engines if e.role == "candidate"), None)
    return ref, cand


def _ready_check(ref: EngineFacts, cand: EngineFacts, policy: Policy) -> Check | None:
    if ref.ready_s is None or cand.ready_s is None:
        return None
    limit = ref.ready_s * (1.0 + policy.startup_tolerance) + policy.startup_slack_s
    rule = f"{1.0 + policy.startup_tolerance:.2f}x + {policy.startup_slack_s:g} s"
    told = (
        f"The candidate became ready in {cand.ready_s:.1f} s vs {ref.ready_s:.1f} s for the "
        f"reference"
    )
    failed = cand.ready_s > limit
    where = "above" if failed else "within"
    return rule_check(
        "startup.ready",
        "startup",
        "ready_s",
        "fail" if failed else "pass",
        f"{told}, {where} the {limit:.1f} s allowed ({rule}).",
        reference=ref.ready_s,
        candidate=cand.ready_s,
        ratio=cand.ready_s / ref.ready_s if ref.ready_s > 0.0 else None,
        threshold=limit,
        samples=(1, 1),
    )


def _welch_pvalue(ref: np.ndarray, cand: np.ndarray, scale: float, slack: float) -> float:
    """One-sided p-value of mean(cand) > scale * mean(ref) + slack (Welch-Satterthwaite)."""
    d = float(cand.mean() - scale * ref.mean() - slack)
    v_c = float(cand.var(ddof=1)) / cand.size
    v_r = scale * scale * float(ref.var(ddof=1)) / ref.size
    se2 = v_c + v_r
    if se2 <= 0.0:
        return 0.0 if d > 0.0 else 1.0
    df = se2 * se2 / (v_c * v_c / (cand.size - 1) + v_r * v_r / (ref.size - 1))
    return float(student_t.sf(d / math.sqrt(se2), df))


def _phase_check(
    phase: str, ref: tuple[float, ...], cand: tuple[float, ...], policy: Policy, alpha: float | None
) -> Check:
    scale = 1.0 + policy.startup_tolerance
    slack = policy.startup_phase_slack_s
    rule = f"{scale:.2f}x + {slack:g} s"
    r = np.asarray(ref)
    c = np.asarray(cand)
    if alpha is not None and r.size >= 2 and c.size >= 2:
        limit = scale * float(r.mean()) + slack
        p = _welch_pvalue(r, c, scale, slack)
        mean_c, mean_r = float(c.mean()), float(r.mean())
        told = (
            f"Startup phase {phase}: the candidate took {mean_c:.1f} s on average over "
            f"{c.size} launches vs {mean_r:.1f} s over {r.size} for the reference"
        )
        decision: Decision
        if p <= alpha:
            decision = "fail"
            message = (
                f"{told}, above the {limit:.1f} s allowed ({rule}); p={p:.2g} (alpha {alpha:.2g})."
            )
        elif mean_c <= limit:
            decision = "pass"
            message = f"{told}, within the {limit:.1f} s allowed ({rule})."
        else:
            decision = "undecided"
            message = (
                f"{told}, above the {limit:.1f} s allowed ({rule}) but not significantly "
                f"(p={p:.2g}, alpha {alpha:.2g}); more launches would settle it."
            )
        return statistic_check(
            f"startup.phase.{phase}",
            "startup",
            phase,
            decision,
            message,
            reference=mean_r,
            candidate=mean_c,
            ratio=mean_c / mean_r if mean_r > 0.0 else None,
            threshold=limit,
            samples=(int(r.size), int(c.size)),
            alpha=alpha,
        )
    value_r = float(np.median(r))
    value_c = float(np.median(c))
    limit = scale * value_r + slack
    failed = value_c > limit
    many = " (median of launches)" if max(r.size, c.size) > 1 else ""
    return rule_check(
        f"startup.phase.{phase}",
        "startup",
        phase,
        "fail" if failed else "pass",
        f"Startup phase {phase}: the candidate took {value_c:.1f} s vs {value_r:.1f} s for "
        f"the reference{many}, {'above' if failed else 'within'} the {limit:.1f} s allowed "
        f"({rule}, one launch each: a rule, not a test).",
        reference=value_r,
        candidate=value_c,
        ratio=value_c / value_r if value_r > 0.0 else None,
        threshold=limit,
        samples=(int(r.size), int(c.size)),
    )


# Phases the gate marks after an engine's start() returns (its paired warm-up): the launch's
# measurement does not cover them, so the guard leaves their rules as they are.
_AFTER_LAUNCH = frozenset({"warmup_done", "ready"})


def _measured(e: EngineFacts, limit: float) -> tuple[float, float] | None:
    """(busy share, longest wait) of a launch other work kept at least `limit` busy."""
    b, w = e.launch_host_busy, e.launch_cpu_wait_s
    return (b, w) if b is not None and w is not None and b >= limit else None


def _guarded(
    checks: list[Check], ref: EngineFacts, cand: EngineFacts, policy: Policy
) -> list[Check]:
    """The startup rules as the launches' host contention lets them stand (module docstring)."""
    limit = policy.startup_host_busy
    if limit is None:
        return checks
    r, c = _measured(ref, limit), _measured(cand, limit)
    if r is None and c is None:
        return checks
    scale = 1.0 + policy.startup_tolerance

    def guarded(ch: Check) -> bool:  # a single-launch rule over the launch
        return (
            ch.alpha is None
            and ch.metric not in _AFTER_LAUNCH
            and None not in (ch.candidate, ch.reference, ch.threshold)
        )

    def allowed(ch: Check) -> float:  # from the reference's time less its wait, if it waited
        assert ch.threshold is not None and ch.reference is not None
        return ch.threshold - (scale * min(r[1], ch.reference) if r is not None else 0.0)

    out = list(checks)
    if c is not None:
        share, wait = c
        said = (
            f"other work kept {share:.0%} of the gate host's CPUs busy during the candidate's "
            f"launch (startup_host_busy {limit:.0%}) and its threads waited up to {wait:.2f} s "
            "for one"
        )
        # the phases share one wait (each second of it delayed one phase at most); launch to
        # ready is the phases together, so it gets the whole wait too
        for ready in (False, True):
            fails = [
                i
                for i, ch in enumerate(out)
                if guarded(ch) and ch.decision == "fail" and (ch.metric == "ready_s") == ready
            ]
            if not fails:
                continue
            need = {i: float(out[i].candidate or 0.0) - allowed(out[i]) for i in fails}
            excused = sum(need.values()) <= wait and all(
                need[i] <= share * float(out[i].candidate or 0.0) for i in fails
            )
            together = f"; the {len(fails)} failed rules need {sum(need.values()):.2f} s of it"
            together = together if len(fails) > 1 else ""
            for i in fails:
                ch = out[i]
                if excused:
                    why = f"{said}{together}, and without it this one is within the allowance"
                    out[i] = _not_shown(ch, why)
                else:
                    note = f"{said[0].upper()}{said[1:]}{together}: not enough to explain it."
                    out[i] = replace(ch, message=f"{ch.message} {note}")
    if r is not None:
        share, wait = r
        for i, ch in enumerate(out):
            if guarded(ch) and ch.decision == "pass" and float(ch.candidate or 0.0) > allowed(ch):
                why = (
                    f"other work kept {share:.0%} of the gate host's CPUs busy during the "
                    f"reference's launch (startup_host_busy {limit:.0%}) and its threads waited up "
                    f"to {wait:.2f} s for one; without that wait the allowance would be "
                    f"{allowed(ch):.1f} s"
                )
                out[i] = _not_shown(ch, why)
    return out


def _not_shown(check: Check, why: str) -> Check:
    return replace(
        check,
        decision="undecided",
        required=False,
        message=f"{check.message} Not shown: {why}. On a quieter host it could be compared.",
    )


def startup_checks(engines: Sequence[EngineFacts], policy: Policy, notes: list[str]) -> list[Check]:
    """Launch-to-ready, then every phase both engines report; each rule as the launches' host
    contention lets it stand (`_guarded`)."""
    ref, cand = _pair(engines)
    if ref is None or cand is None:
        missing = "reference" if ref is None else "candidate"
        notes.append(f"Startup not compared: no facts about the {missing} engine.")
        return []
    return _guarded(_startup_rules(ref, cand, policy, notes), ref, cand, policy)


def _startup_rules(
    ref: EngineFacts, cand: EngineFacts, policy: Policy, notes: list[str]
) -> list[Check]:
    checks: list[Check] = []
    ready = _ready_check(ref, cand, policy)
    if ready is None:
        attached = [e.role for e in (ref, cand) if e.ready_s is None]
        notes.append(
            f"Startup not compared: the {' and '.join(attached)} endpoint was attached, "
            "not launched by the gate."
        )
    else:
        checks.append(ready)
    phases_r = ref.phase_durations()
    phases_c = cand.phase_durations()
    only = sorted(set(phases_r) ^ set(phases_c))
    if only:
        notes.append(
            f"Startup phase(s) {', '.join(only)} reported by one engine only, not compared."
        )
    common = [p for p in phases_r if p in phases_c]
    tested = [p for p in common if len(phases_r[p]) >= 2 and len(phases_c[p]) >= 2]
    budget = policy.group_alpha("startup")
    alpha = budget / len(tested) if tested and budget > 0.0 else None
    if tested and alpha is None:
        notes.append(
            "Startup phases were launched repeatedly but alpha_split gives startup no budget: "
            "compared by the single-launch rule on medians instead of tested."
        )
    for phase in common:
        checks.append(
            _phase_check(
                phase, phases_r[phase], phases_c[phase], policy, alpha if phase in tested else None
            )
        )
    return checks


def crash_checks(engines: Sequence[EngineFacts]) -> list[Check]:
    """A crash, restart or OOM of either engine holds; the reference's voids the comparison."""
    checks: list[Check] = []
    seen: dict[str, int] = {}
    for e in engines:
        seen[e.role] = seen.get(e.role, 0) + 1
        cid = f"crash.{e.role}" if seen[e.role] == 1 else f"crash.{e.role}.{seen[e.role]}"
        events = []
        if e.crashed:
            events.append(f"crashed ({e.crash_detail or 'no detail recorded'})")
        if e.oom:
            events.append("ran out of memory")
        if e.restarts:
            events.append(f"restarted {e.restarts} time{'s' if e.restarts != 1 else ''}")
        failed = bool(events)
        if not failed:
            message = f"The {e.role} engine ran without crashing."
        elif e.role == "candidate":
            if e.crashed and not e.oom and not e.restarts:
                message = f"The candidate engine crashed: {e.crash_detail or 'no detail recorded'}."
            else:
                message = f"The candidate engine {' and '.join(events)}."
        else:
            message = (
                f"The reference engine {' and '.join(events)}, so the comparison is void; the "
                "gate holds rather than judge the candidate against a broken baseline."
            )
            if e.crashed and not e.oom and not e.restarts:
                message = (
                    f"The reference engine crashed ({e.crash_detail or 'no detail recorded'}), "
                    "so the comparison is void; the gate holds rather than judge the candidate "
                    "against a broken baseline."
                )
        checks.append(rule_check(cid, "crash", "crashed", "fail" if failed else "pass", message))
    return checks
