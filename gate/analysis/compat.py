"""API compatibility: the candidate must answer every probe the reference answers well.

A probe is one request the gate sends to both engines outside the load (an endpoint, a
parameter, a streaming option, a tool call), reduced by the gate to what matters for clients:
whether it succeeded, its HTTP status, whether the body parsed as the API promises, and the set
of keys (dotted paths) of the response schema. Compatibility is a fact, not a statistic:

    - the reference answered well (ok and well formed) and the candidate errored, changed the
      status class, or returned something malformed: fail;
    - the candidate's response lacks keys the reference's has: fail (clients that read them
      break); keys the candidate adds are reported but pass (additive changes are compatible);
    - the reference itself failed the probe: the probe says nothing about the candidate, and
      becomes a note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gate.analysis.checks import rule_check
from gate.analysis.types import Check, Decision

__all__ = ["ProbePair", "ProbeResult", "capability_checks", "compatibility_checks"]


@dataclass(frozen=True)
class ProbeResult:
    """What one engine answered to one probe (loadgen.suite.ProbeResult reduced to what the
    judge needs): status 0 when no HTTP status came back; problems: what made the body
    malformed, for the message."""

    ok: bool
    status: int
    well_formed: bool
    schema_keys: frozenset[str] = field(default_factory=frozenset)
    problems: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema_keys", frozenset(self.schema_keys))
        object.__setattr__(self, "problems", tuple(self.problems))


@dataclass(frozen=True)
class ProbePair:
    """The same probe sent to both engines."""

    name: str
    reference: ProbeResult
    candidate: ProbeResult


def _keys(keys: frozenset[str], limit: int = 5) -> str:
    items = sorted(keys)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def compatibility_checks(probes: Sequence[ProbePair], notes: list[str]) -> list[Check]:
    """One check per probe the reference answered well."""
    checks: list[Check] = []
    for probe in probes:
        ref, cand = probe.reference, probe.candidate
        if not (ref.ok and ref.well_formed):
            notes.append(
                f"Probe {probe.name} not judged: the reference itself failed it (status "
                f"{ref.status}), so it says nothing about the candidate."
            )
            continue
        missing = ref.schema_keys - cand.schema_keys
        added = cand.schema_keys - ref.schema_keys
        problems: list[str] = []
        if not cand.ok:
            problems.append(
                f"it failed with status {cand.status} where the reference got {ref.status}"
            )
        elif cand.status // 100 != ref.status // 100:
            problems.append(f"its status {cand.status} differs from the reference's {ref.status}")
        if cand.ok and not cand.well_formed:
            why = f" ({'; '.join(cand.problems[:2])})" if cand.problems else ""
            problems.append(f"its response is malformed{why}")
        if cand.ok and cand.well_formed and missing:
            problems.append(f"its response lacks {_keys(missing)}")
        decision: Decision = "fail" if problems else "pass"
        if problems:
            message = f"Probe {probe.name} breaks clients: {'; '.join(problems)}."
        else:
            extra = f" (it adds {_keys(added)}, which is compatible)" if added else ""
            message = f"Probe {probe.name}: the candidate answers as the reference does{extra}."
        checks.append(
            rule_check(
                f"compat.{probe.name}",
                "compatibility",
                "probe",
                decision,
                message,
                reference=float(ref.status),
                candidate=float(cand.status),
                samples=(1, 1),
            )
        )
    return checks


_FEATURE_WORDS = {
    "completions": "the completions API",
    "chat": "the chat API (a chat template)",
    "logprobs": "logprobs",
    "top_logprobs_max": "as many top logprobs",
    "prompt_logprobs": "prompt logprobs (teacher-forced scoring)",
    "token_ids": "output token ids",
    "prompt_token_ids": "prompt token ids",
    "stream_usage": "usage in streams",
}


def capability_checks(
    reference: Mapping[str, Any] | None, candidate: Mapping[str, Any] | None, notes: list[str]
) -> list[Check]:
    """One check per feature the reference has (loadgen/capabilities.py, as the verdict
    document lists them): the candidate lost it, a compatibility failure; kept, a pass. A
    feature the reference lacks is not judged (a note), and the gate's own checks that need it
    were already adapted. Nothing when either engine's capabilities are unknown."""
    if reference is None or candidate is None:
        return []
    checks: list[Check] = []
    lacking = []
    for feature, words in _FEATURE_WORDS.items():
        ref, cand = reference.get(feature), candidate.get(feature)
        if feature == "top_logprobs_max":
            if not isinstance(ref, int) or ref <= 0:
                continue
            lost = not isinstance(cand, int) or cand < ref
            told = f"up to {ref} top logprobs per token, the candidate {cand or 0}"
        else:
            if not ref:
                lacking.append(words)
                continue
            lost = not cand
            told = "supports it" if not lost else "does not"
        decision: Decision = "fail" if lost else "pass"
        if feature == "top_logprobs_max":
            message = f"Top logprobs: the reference returns {told}" + (
                "; clients that ask for as many are refused." if lost else "."
            )
        elif lost:
            message = f"The candidate lost {words}: the reference supports it and clients use it."
        else:
            message = f"The candidate keeps {words}, as the reference has it."
        checks.append(
            rule_check(
                f"compat.capability.{feature}",
                "compatibility",
                "capability",
                decision,
                message,
                reference=float(ref) if isinstance(ref, int | float) else 1.0,
                candidate=float(cand) if isinstance(cand, int | float) else float(bool(cand)),
                samples=(1, 1),
            )
        )
    if lacking:
        notes.append(
            f"Not judged, because the reference lacks them too: {', '.join(lacking)}; the "
            "checks that need them were skipped or adapted (capabilities in the engines)."
        )
    return checks
