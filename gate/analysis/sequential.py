"""The sequential judge: what a gate may conclude at each look at a scenario still running.

References:
    S. R. Howard and A. Ramdas, "Sequential estimation of quantiles with applications to
    A/B-testing and best-arm identification", Bernoulli 28(3), 2022.
    R. Johari, P. Koomen, L. Pekelis and D. Walsh, "Always valid inference: continuous
    monitoring of A/B tests", Operations Research 70(3), 2022.

Why: most regressions are large, and a gate that sees a 30% tail regression after two thousand
requests should not spend the next eighteen thousand confirming it. Every test of a scenario is
anytime-valid once the plan (plan.py) fixes its tuning and alpha, so the gate may feed the
arrays it has so far, at any moments it likes, and act on the answer:

    - `hold`: some check failed; the verdict will be hold whatever comes next, so the scenario
      can stop now;
    - `all_decided`: every check of the scenario is decided, so more samples would change
      nothing;
    - at the planned size every check is decided: what is still undecided is inconclusive,
      unless the plan lets the scenario extend (policy `extend`) and that inconclusive check
      is all that would hold it: then it runs on, looking as before, until a look where
      nothing would be inconclusive or until its limit (`extending`). The sequences hold at
      every size, so the extra looks cost no false holds; a candidate that is as good as the
      reference but noisy gets the samples to show it instead of a hold.

The errors check passes before the planned end only when the count test has no evidence and the
candidate's failed share so far is within `error_tolerance` of the reference's (errors.py), so a
clean scenario whose latency checks all pass stops early (judge v3); latency checks decide both
ways (fail below alpha, pass below beta, each spent over the planned looks: paired.py), and
one still undecided at the end does not hold unless the policy requires it (then the scenario
may extend). The final
`judge(..., plan=plan)` on the same samples gives the same decisions and intervals as the last
look (the same blocks and tests). A decision is the one at the current look: under drift a
check decided at one look may be undecided at the next, so the gate stops on a look where
everything is decided, never on decisions collected from different looks. An advisory check
(policy.advisory) is looked at as any other but never stops a scenario on a hold nor extends it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.analysis.advisory import mark_advisory
from gate.analysis.errors import error_check, outputs_checks
from gate.analysis.latency import planned_latency_checks
from gate.analysis.plan import Plan
from gate.analysis.types import ArmSamples, Check, ScenarioSamples

__all__ = ["Look", "SequentialJudge"]


def _extends(c: Check) -> bool:
    """An undecided required check that more samples could settle (an unhealthy test bed,
    `gate.environment`, is not one)."""
    return c.decision == "undecided" and c.required and not c.advisory and c.metric != "environment"


def _fails(c: Check) -> bool:
    """A failed check that holds (an advisory one never does, policy.advisory)."""
    return c.decision == "fail" and not c.advisory


@dataclass(frozen=True)
class Look:
    """The state of one scenario at one look.

    samples: requests per arm seen (reference, candidate); planned: the scenario's planned
    size; limit: the most it may run (planned, or more when it may extend); checks: every check
    as it stands (an undecided one reads "undecided"); decided: ids of the checks whose
    decision is final; extending: past the planned size because a check is undecided.
    """

    scenario: str
    samples: tuple[int, int]
    planned: int
    checks: tuple[Check, ...]
    decided: frozenset[str]
    notes: tuple[str, ...]
    limit: int = 0
    extending: bool = False

    @property
    def at_limit(self) -> bool:
        """The scenario's schedule is used up: it ends here whatever the look says."""
        return min(self.samples) >= max(self.limit, self.planned)

    @property
    def past_plan(self) -> bool:
        return min(self.samples) >= self.planned

    @property
    def hold(self) -> bool:
        """A check failed: the gate will hold whatever more samples say."""
        return any(_fails(c) for c in self.checks)

    @property
    def all_decided(self) -> bool:
        return all(c.id in self.decided for c in self.checks)

    @property
    def stop(self) -> bool:
        """The scenario may stop: more samples cannot change the verdict."""
        return (
            self.hold
            or self.all_decided
            or self.at_limit
            or (self.past_plan and not self.extending)
        )

    @property
    def undecided(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.checks if c.id not in self.decided)


@dataclass
class SequentialJudge:
    """Feed it growing prefixes of each scenario; it answers at every look.

    It keeps no state: a look is a pure function of the plan and the samples, so the same
    prefix always gets the same answer, looks may come at any moments, and the gate may
    restart a judge without changing anything.
    """

    plan: Plan

    def look(self, scenario: str, reference: ArmSamples, candidate: ArmSamples) -> Look:
        """The decisions the samples so far support (arrays in send order, warm-up dropped)."""
        if scenario not in self.plan.requests:
            raise ValueError(
                f"scenario {scenario!r} is not in the plan {sorted(self.plan.requests)}"
            )
        planned = int(self.plan.requests[scenario])
        limit = self.plan.limit(scenario)
        s = ScenarioSamples(scenario, reference, candidate)
        n = min(reference.requests, candidate.requests)
        final = n >= planned
        checks, notes = self._checks(s, planned, final)
        extending = (
            final
            and n < limit
            and not any(_fails(c) for c in checks)
            and any(_extends(c) for c in checks)
        )
        if extending:
            undecided = [c.id for c in checks if _extends(c)]
            # Judged again as a look before the end: undecided checks stay open while it runs.
            checks, notes = self._checks(s, limit, False)
            notes.append(
                f"{scenario} runs past its planned {planned} requests per arm (up to {limit}, "
                f"policy extend {self.plan.policy.extend:g}): {', '.join(undecided)} undecided "
                f"at {n}."
            )
        final = final and not extending
        decided = frozenset(c.id for c in checks if final or c.decision != "undecided")
        return Look(
            scenario=scenario,
            samples=(reference.requests, candidate.requests),
            planned=planned,
            checks=tuple(checks),
            decided=decided,
            notes=tuple(notes),
            limit=limit,
            extending=extending,
        )

    def _checks(
        self, s: ScenarioSamples, horizon: int, final: bool
    ) -> tuple[list[Check], list[str]]:
        notes: list[str] = []
        checks: list[Check] = []
        checks.extend(planned_latency_checks([s], self.plan, notes, final=final))
        checks.extend(
            error_check(
                s,
                self.plan.error_alpha,
                self.plan.policy,
                notes,
                None if final else horizon,
                self.plan.layout(s.name),
                self.plan.look_sizes(s.name),
            )
        )
        checks.extend(outputs_checks([s]))
        return mark_advisory(checks, self.plan.policy), notes
