"""Advisory checks (`policy.advisory`): computed and shown, never holding.

How a team brings in a new check without blocking rollouts, as Argo Rollouts' `dryRun`
metrics do (argoproj/argo-rollouts utils/analysis/helpers.go: `IsTerminating` skips a result
marked `DryRun`, and `GetDryRunMetrics` refuses a rule that matches no metric,
"dryRun[%d]: Rule didn't match any metric name(s)"). Here an advisory check is judged exactly
as it would be otherwise, with its share of the error budget (so making it blocking later
changes nothing about its test), and the verdict lists the ones that failed apart
(`Verdict.advisory`): they never hold, never stop a scenario early and never extend one.

A pattern is either
- a `require` key ('ttft.p90', 'itl.tail', 'p90', 'tail', 'window'): those latency checks in
  every scenario, as `require` reads it; or
- a check id with shell-style wildcards ('steady.ttft.p90', 'startup.phase.*',
  'compat.capability.*', '*.errors'): `*` any run of characters, `?` one.

A pattern that matches no check the gate can make is refused, naming it (a typo would
otherwise leave the check blocking). `gate.environment` (the test bed, not the candidate) and
`latency.coverage` (no latency evidence at all) are never advisory: a gate that cannot judge
holds. Whether a pattern can match is decided against the families of check ids the judge
builds (`families`), without running anything: both are patterns over characters, and their
intersection is searched directly (`_meet`).

Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from gate.analysis.check_keys import key_problem, matches_key, quantile_key
from gate.analysis.types import Check

if TYPE_CHECKING:
    from gate.analysis.policy import Policy

__all__ = [
    "NEVER_ADVISORY",
    "families",
    "is_latency_key",
    "mark_advisory",
    "pattern_problem",
    "unmatched",
]

NEVER_ADVISORY: tuple[str, ...] = ("gate.environment", "latency.coverage")
"""What says the gate could not judge: a gate that cannot judge holds, whatever the policy."""

_PATTERN_RE = re.compile(r"^[A-Za-z0-9._*?-]+$")
_CORRECTNESS = (
    "answered",
    "finite",
    "empty",
    "length",
    "greedy.flips",
    "greedy.margin",
    "greedy.position",
    "teacher.logprob",
    "teacher.top1",
    "teacher.kl",
)
_ROLES = ("reference", "candidate")
_FREE = object()  # one dotless run of characters: a phase, a probe, a capability
_ANY = object()  # one run of any characters: a scenario name (names may hold dots)

Slot = str | tuple[str, ...] | object
Family = tuple[Slot, ...]


def is_latency_key(pattern: str) -> bool:
    """Whether a pattern is a `require` key (read as `require` reads it)."""
    return "*" not in pattern and "?" not in pattern and key_problem(pattern) is None


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with a pattern's spelling, or None."""
    if not _PATTERN_RE.match(pattern):
        return (
            f"{pattern!r} is not a check pattern: letters, digits, '.', '_', '-' and the "
            "wildcards '*' and '?' only"
        )
    return None


def families(policy: Policy, scenarios: Sequence[str] | None = None) -> list[Family]:
    """Every shape of check id the judge can build under this policy, as slot sequences
    joined by dots (scenarios None: any scenario name). Kept beside the judge's own ids by
    a test that runs a gate and finds each of its checks here."""
    scen: Slot = tuple(scenarios) if scenarios is not None else _ANY
    kinds = [*(quantile_key(q) for q in policy.checked_quantiles), "window", "creep"]
    if policy.group_alpha("tail") > 0.0:
        kinds.append("tail")
    error_kinds = (*policy.error_kinds, "other")
    return [
        (scen, tuple(policy.metrics), tuple(kinds)),
        (scen, "errors"),
        (scen, "errors", error_kinds),
        (scen, "outputs"),
        (scen, "outputs", "divergence"),
        (scen, "saturation", "candidate"),
        (scen, ("goodput", "overload", "recovery")),
        (scen, "capacity"),  # a capacity scenario's search (capacity.py)
        (scen, "engine", _FREE),  # the engines' own metrics (engine_metrics.py)
        ("engine", _FREE),
        ("gpu", ("memory", "energy_per_token", "xid")),  # the engines' GPUs (gpu.py)
        ("startup", "ready"),
        ("startup", "phase", _ANY),  # a worker group's phases are GROUP.PHASE
        ("crash", _ROLES),
        ("crash", _ROLES, _FREE),
        ("compat", _FREE),
        ("compat", "capability", _FREE),
        ("correctness", _CORRECTNESS),
    ]


# -- does a wildcard pattern meet a family? --------------------------------------------------
# Both sides become token lists: ("c", char) one given character, ("1", dots) one character,
# ("*", dots) any run of characters, where `dots` says whether '.' may be among them. A string
# matches both iff the product of the two automata reaches both ends (a breadth-first search
# over pairs of positions; characters are the literals in play, '.', and one "other").

Token = tuple[str, object]


def _glob_tokens(pattern: str) -> list[Token]:
    out: list[Token] = []
    for ch in pattern:
        out.append(("*", True) if ch == "*" else ("1", True) if ch == "?" else ("c", ch))
    return out


def _slot_tokens(slot: Slot) -> list[list[Token]]:
    """The token lists a slot may be (one per option)."""
    if slot is _FREE:
        return [[("1", False), ("*", False)]]
    if slot is _ANY:
        return [[("1", True), ("*", True)]]
    options = (slot,) if isinstance(slot, str) else slot
    assert isinstance(options, tuple)
    return [[("c", ch) for ch in str(o)] for o in options]


def _family_tokens(family: Family) -> list[list[Token]]:
    seqs: list[list[Token]] = [[]]
    for i, slot in enumerate(family):
        sep: list[Token] = [("c", ".")] if i else []
        seqs = [s + sep + t for s in seqs for t in _slot_tokens(slot)]
    return seqs


def _closure(tokens: list[Token], i: int) -> set[int]:
    out = {i}
    while i < len(tokens) and tokens[i][0] == "*":
        i += 1
        out.add(i)
    return out


def _step(tokens: list[Token], i: int, ch: str) -> int | None:
    if i >= len(tokens):
        return None
    kind, val = tokens[i]
    if kind == "c":
        return i + 1 if val == ch else None
    if ch == "." and not val:
        return None
    return i + 1 if kind == "1" else i


def _meet(a: list[Token], b: list[Token]) -> bool:
    chars = {str(v) for k, v in (*a, *b) if k == "c"} | {".", "\0"}
    start = {(i, j) for i in _closure(a, 0) for j in _closure(b, 0)}
    seen, todo = set(start), list(start)
    while todo:
        i, j = todo.pop()
        if i == len(a) and j == len(b):
            return True
        for ch in chars:
            ni, nj = _step(a, i, ch), _step(b, j, ch)
            if ni is None or nj is None:
                continue
            for pair in ((x, y) for x in _closure(a, ni) for y in _closure(b, nj)):
                if pair not in seen:
                    seen.add(pair)
                    todo.append(pair)
    return False


def _can_match(pattern: str, fams: Iterable[Family]) -> bool:
    tokens = _glob_tokens(pattern)
    return any(_meet(tokens, seq) for f in fams for seq in _family_tokens(f))


def unmatched(
    patterns: Sequence[str], policy: Policy, scenarios: Sequence[str] | None = None
) -> list[tuple[int, str]]:
    """(index, why) of each wildcard pattern that matches no check this gate can make
    (`require` keys are checked as `require` is, by the policy)."""
    fams = families(policy, scenarios)
    out = []
    for i, p in enumerate(patterns):
        if is_latency_key(p) or _can_match(p, fams):
            continue
        never = [n for n in NEVER_ADVISORY if fnmatch.fnmatchcase(n, p)]
        where = f" in scenarios {list(scenarios)}" if scenarios is not None else ""
        why = (
            f"{p!r} matches only {', '.join(never)}, which is never advisory (a gate that "
            "cannot judge holds)"
            if never
            else f"{p!r} matches no check this gate can make{where}: check ids look like "
            "'steady.ttft.p90', 'steady.errors', 'startup.phase.*', 'compat.capability.*', "
            "'correctness.teacher.kl'"
        )
        out.append((i, why))
    return out


def _kind(check: Check) -> str:
    return "tail" if check.quantile is not None else check.id.rsplit(".", 1)[-1]


def _marks(check: Check, policy: Policy) -> bool:
    if check.id in NEVER_ADVISORY:
        return False
    for p in policy.advisory:
        if is_latency_key(p):
            if check.group == "latency" and matches_key(
                [p], check.metric, check.quantile, _kind(check)
            ):
                return True
        elif fnmatch.fnmatchcase(check.id, p):
            return True
    return False


def mark_advisory(checks: Iterable[Check], policy: Policy) -> list[Check]:
    """The checks, those the policy's `advisory` names marked so (they never hold)."""
    if not policy.advisory:
        return list(checks)
    return [replace(c, advisory=True) if _marks(c, policy) else c for c in checks]
