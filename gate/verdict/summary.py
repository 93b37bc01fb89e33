"""One meaning of `continue`, on every surface: the summary line, the warnings and what a
continue could not show, made once from a gate's checks.

A gate holds on evidence (a check failed), on facts (a crash, an OOM, broken outputs, an unfit
test bed: each a failed check), and when a required check is left undecided. Anything else
continues, and a continue says what it did not show (an undecided check that is not required,
`CheckDoc.required`) and its warnings (`CheckDoc.warning`: past a warning threshold, an error
rate above the ceiling without confidence, a test bed that looks unhealthy). The terminal, the
report, the API, the commit status and the Argo and Flagger answers all print what `summarize`
returns, so none of them can say "every check passed" beside an undecided check, or drop a
warning another shows. Exit codes and rollout answers stay binary: this is what they say, not
what they decide. Advisory checks (policy.advisory) that would have held are listed apart
(`Summary.advisory`, "; advisory: 1 check failed (steady.ttft.p90)" in the line): never among
the reasons, the warnings or what a continue did not show.

The line is at most `LINE_CHARS` characters, the tightest surface's limit: GitHub's
commit-status description is refused past 140 characters (422 "description is too long
(maximum is 140 characters)", REST "Create a commit status"), and the same words are shown
everywhere else. What does not fit is counted ("and 2 more"); the lists carry it whole.

Pure: checks in, words out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gate.core.vocabulary import GateDecision
from gate.verdict.document import CheckDoc, ReasonDoc, VerdictDocument

__all__ = [
    "ANSWER_ITEMS",
    "LINE_CHARS",
    "Summary",
    "bounded",
    "latency_label",
    "not_shown_phrase",
    "stored_summary",
    "summarize",
    "summary_of",
]

LINE_CHARS = 140  # GitHub's commit-status description (see the module docstring)
ANSWER_ITEMS = 20  # warnings and not-shown items in a small answer (the API's verdict object)
ELLIPSIS = "..."  # ASCII: every receiver counts it as three characters
METRIC_WORDS = {"ttft": "TTFT", "itl": "ITL", "e2e": "E2E"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _percent(ratio: float) -> str:
    """1.10 -> '+10%', 1.066 -> '+6.6%', 0.97 -> '-3%'."""
    x = (ratio - 1.0) * 100.0
    digits = 0 if abs(x) >= 10 or float(round(x)) == round(x, 1) else 1
    return f"{x:+.{digits}f}%"


def latency_label(check: CheckDoc) -> str:
    """'TTFT p90 in steady', 'ITL tail in burst', 'TTFT window in steady': how people name a
    latency check (a check of no quantile by the last part of its id: tail, window, creep)."""
    metric = METRIC_WORDS.get(check.metric or "", check.metric or check.id)
    if check.quantile is not None:
        what = f"p{round(check.quantile * 100.0, 6):g}"
    else:
        what = check.id.rsplit(".", 1)[-1]
    where = f" in {check.scenario}" if check.scenario else ""
    return f"{metric} {what}{where}"


def not_shown_phrase(check: CheckDoc) -> str:
    """What a continue could not show about this check. A latency check: its tolerance and,
    where the interval's upper end is finite, what was shown ('TTFT p90 in steady within +10%
    (shown: at most +14%)'), else what it could have detected at this size ('TTFT tail in
    steady within +10% (could detect +24%)'); any other: its own message."""
    if check.group != "latency" or check.threshold is None or not check.metric:
        return check.message
    phrase = f"{latency_label(check)} within {_percent(check.threshold)}"
    hi = check.interval[1] if check.interval and len(check.interval) == 2 else None
    if hi is not None and math.isfinite(hi):
        phrase += f" (shown: at most {_percent(hi)})"
    elif check.detectable is not None and math.isfinite(check.detectable):
        phrase += f" (could detect {_percent(check.detectable)})"
    return phrase


def _would_hold(check: CheckDoc) -> bool:
    return check.decision == "fail" or (check.decision == "undecided" and check.required)


def _listed(ids: Sequence[str], k: int) -> str:
    """' (a, b and 3 more)' naming the first k of ids; '' for k 0."""
    if k <= 0 or not ids:
        return ""
    shown = ", ".join(ids[:k])
    rest = len(ids) - k
    return f" ({shown} and {rest} more)" if rest > 0 else f" ({shown})"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(ELLIPSIS)].rstrip() + ELLIPSIS


@dataclass(frozen=True)
class Summary:
    """A gate's verdict in words. failed / undecided: the ids of the failed checks and of the
    required checks left undecided (what holds); others: why a gate with neither holds (an
    error, a refused spec); warnings and not_shown: check id and what to say, in check order;
    advisory: the advisory checks that would have held (policy.advisory), apart: they hold
    nothing."""

    verdict: GateDecision
    failed: tuple[str, ...] = ()
    undecided: tuple[str, ...] = ()
    others: tuple[ReasonDoc, ...] = ()
    warnings: tuple[ReasonDoc, ...] = ()
    not_shown: tuple[ReasonDoc, ...] = ()
    advisory: tuple[ReasonDoc, ...] = ()

    def _advisory_part(self, k: int) -> str:
        """'' or '; advisory: 1 check failed (steady.ttft.p90)' naming at most k of them."""
        if not self.advisory:
            return ""
        ids = [r.check for r in self.advisory]
        return f"; advisory: {_plural(len(ids), 'check')} failed{_listed(ids, k)}"

    @property
    def with_warnings(self) -> str:
        """'' or ', with 2 warnings'."""
        return f", with {_plural(len(self.warnings), 'warning')}" if self.warnings else ""

    @property
    def banner(self) -> str:
        """The verdict word as a banner shows it: 'CONTINUE', 'CONTINUE, with 2 warnings',
        'HOLD'."""
        advisory = (
            f", {_plural(len(self.advisory), 'advisory check')} failed" if self.advisory else ""
        )
        if self.verdict == "hold":
            return f"HOLD{advisory}"
        return f"CONTINUE{self.with_warnings}{advisory}"

    def _compose(self, k: int) -> str:
        """The line naming at most k items of each list (k large: all of them)."""
        if self.verdict == "continue":
            head = f"continue{self.with_warnings}{self._advisory_part(k)}"
            n = len(self.not_shown)
            if not n:
                return head
            if k <= 0:
                return f"{head}; {_plural(n, 'check')} not shown"
            shown = "; ".join(r.message for r in self.not_shown[:k])
            more = f" (and {n - k} more)" if n > k else ""
            return f"{head}; not shown: {shown}{more}"
        parts = []
        if self.failed:
            failed = _plural(len(self.failed), "check")
            parts.append(f"{failed} failed{_listed(self.failed, k)}")
        if self.undecided:
            required = _plural(len(self.undecided), "required check")
            parts.append(f"{required} undecided{_listed(self.undecided, k)}")
        if parts:
            return "hold: " + ", ".join(parts) + self._advisory_part(k)
        if self.others:
            first = self.others[0].message.split(":\n", 1)[0]  # a list's heading
            rest = len(self.others) - 1
            return f"hold: {' '.join(first.split())}" + (f" (and {rest} more)" if rest else "")
        return "hold"

    def line(self, limit: int = LINE_CHARS) -> str:
        """One line within `limit` characters: as many items as fit, the rest counted."""
        most = max(len(self.not_shown), len(self.failed), len(self.undecided), len(self.advisory))
        for k in range(most, -1, -1):
            text = self._compose(k)
            if len(text) <= limit:
                return text
        return _clip(self._compose(0), limit)


def summarize(
    verdict: GateDecision, checks: Iterable[CheckDoc], reasons: Iterable[ReasonDoc] = ()
) -> Summary:
    """The one way every surface puts a verdict in words (see the module docstring)."""
    checks = list(checks)
    ids = {c.id for c in checks}
    return Summary(
        verdict=verdict,
        failed=tuple(c.id for c in checks if c.decision == "fail" and not c.advisory),
        undecided=tuple(
            c.id for c in checks if c.decision == "undecided" and c.required and not c.advisory
        ),
        others=tuple(r for r in reasons if r.check not in ids),
        warnings=tuple(
            ReasonDoc(check=c.id, message=c.warning)
            for c in checks
            if c.warning and not _would_hold(c)
        ),
        not_shown=tuple(
            ReasonDoc(check=c.id, message=not_shown_phrase(c))
            for c in checks
            if c.decision == "undecided" and not c.required and not c.advisory
        ),
        advisory=tuple(
            ReasonDoc(check=c.id, message=c.message)
            for c in checks
            if c.advisory and _would_hold(c)
        ),
    )


def summary_of(doc: VerdictDocument) -> Summary:
    """A document's summary, from its checks: the same for a document stored before the
    summary was (its `summary`, `warnings` and `not_shown` absent) as for a new one."""
    return summarize(doc.verdict, doc.checks, doc.reasons)


def stored_summary(
    verdict: str | None, document: Mapping[str, Any] | None, reason: str | None = None
) -> Summary:
    """The summary of a stored gate from its row: the verdict column, the document's checks
    and reasons (only those are read: a list of gates summarizes each without validating whole
    documents), and the row's reason where the document gives none (a gate whose document
    was not written, or does not fit this version: its checks are then left out)."""
    checks: list[CheckDoc] = []
    reasons: list[ReasonDoc] = []
    if isinstance(document, Mapping):
        try:
            checks = [CheckDoc.model_validate(c) for c in document.get("checks") or ()]
            reasons = [ReasonDoc.model_validate(r) for r in document.get("reasons") or ()]
        except ValidationError:
            checks, reasons = [], []
    if not reasons and reason:
        reasons = [ReasonDoc(check="gate", message=reason)]
    return summarize("continue" if verdict == "continue" else "hold", checks, reasons)


def bounded(items: Sequence[ReasonDoc], cap: int) -> tuple[list[ReasonDoc], int]:
    """The first `cap` items and how many were left out: an answer stays small whatever the
    gate ran."""
    return list(items[:cap]), max(0, len(items) - cap)
