"""The one function every surface says a verdict with (gate/verdict/summary.py): a continue
names its warnings and what it could not show, a hold what held it, in one line within GitHub's
140 characters; the document carries it; a document stored before it reads and says the same."""

from __future__ import annotations

from dataclasses import replace

import pytest
from verdicts import (
    CONTINUE_LINE,
    ERRORS,
    FAILED,
    HOLD_LINE,
    NOT_SHOWN,
    SLOWER,
    mixed_document,
    old_document,
)

from gate.verdict import VerdictDocument, check_doc
from gate.verdict.document import CheckDoc, ReasonDoc
from gate.verdict.summary import (
    LINE_CHARS,
    bounded,
    not_shown_phrase,
    stored_summary,
    summarize,
    summary_of,
)


def _not_shown(n: int) -> list[CheckDoc]:
    """n undecided latency checks that do not hold, in scenarios s0..s(n-1)."""
    return [check_doc(replace(NOT_SHOWN, id=f"s{i}.ttft.p90", scenario=f"s{i}")) for i in range(n)]


def test_the_document_of_a_continue_says_its_warnings_and_what_it_did_not_show() -> None:
    doc = mixed_document(hold=False)
    assert doc.verdict == "continue" and doc.exit_code == 0 and doc.reasons == []
    assert doc.summary == CONTINUE_LINE
    assert [w.check for w in doc.warnings] == ["steady.itl.p50", "steady.errors"]
    assert doc.warnings[1].message == ERRORS.warning
    assert doc.not_shown == [
        ReasonDoc(
            check="steady.ttft.p90",
            message="TTFT p90 in steady within +10% (shown: at most +14%)",
        )
    ]
    again = VerdictDocument.read(doc.to_json())
    assert again.to_json() == doc.to_json()  # the new keys round-trip
    assert summary_of(again).line() == doc.summary


def test_the_document_of_a_hold_names_what_held_it_and_keeps_its_warnings() -> None:
    doc = mixed_document(hold=True)
    assert doc.verdict == "hold" and doc.exit_code == 1
    assert doc.summary == HOLD_LINE
    assert [r.check for r in doc.reasons] == ["steady.ttft.p50"]
    assert len(doc.warnings) == 2 and len(doc.not_shown) == 1
    assert summary_of(doc).banner == "HOLD"


def test_banner_words() -> None:
    assert summary_of(mixed_document(hold=False)).banner == "CONTINUE, with 2 warnings"
    one = summarize("continue", [check_doc(SLOWER)])
    assert one.banner == "CONTINUE, with 1 warning" and one.line() == "continue, with 1 warning"
    assert summarize("continue", []).banner == "CONTINUE"
    assert summarize("continue", []).line() == "continue"


def test_a_warning_on_a_check_that_holds_is_a_reason_not_a_warning() -> None:
    failed = check_doc(replace(FAILED, warning="past its warning threshold too"))
    said = summarize("hold", [failed], [ReasonDoc(check=failed.id, message=failed.message)])
    assert said.warnings == ()
    assert said.line() == HOLD_LINE


def test_a_required_undecided_check_holds_and_is_not_listed_as_not_shown() -> None:
    required = check_doc(replace(NOT_SHOWN, required=True))
    said = summarize("hold", [check_doc(FAILED), required])
    assert said.not_shown == ()
    assert said.line() == (
        "hold: 1 check failed (steady.ttft.p50), 1 required check undecided (steady.ttft.p90)"
    )


@pytest.mark.parametrize(
    ("interval", "threshold", "phrase"),
    [
        ([0.98, 1.14], 1.10, "TTFT p90 in steady within +10% (shown: at most +14%)"),
        ([0.99, 1.066], 1.05, "TTFT p90 in steady within +5% (shown: at most +6.6%)"),
        # unbounded: what it could have detected, where that is known
        ([0.9, None], 1.10, "TTFT p90 in steady within +10% (could detect +22%)"),
        (None, 1.10, "TTFT p90 in steady within +10% (could detect +22%)"),
    ],
)
def test_not_shown_latency_phrase(
    interval: list[float | None] | None, threshold: float, phrase: str
) -> None:
    doc = check_doc(NOT_SHOWN).model_copy(update={"interval": interval, "threshold": threshold})
    assert not_shown_phrase(doc) == phrase
    # nothing shown, nothing known: the tolerance alone
    bare = check_doc(NOT_SHOWN).model_copy(update={"interval": None, "detectable": None})
    assert not_shown_phrase(bare) == "TTFT p90 in steady within +10%"


def test_not_shown_names_the_tail_and_other_checks_by_their_message() -> None:
    tail = check_doc(replace(NOT_SHOWN, id="burst.itl.tail", metric="itl", scenario="burst"))
    tail = tail.model_copy(update={"quantile": None})
    assert not_shown_phrase(tail) == "ITL tail in burst within +10% (shown: at most +14%)"
    # the window and creep checks have no quantile either: named as what they are, not "tail"
    for kind in ("window", "creep"):
        scan = check_doc(replace(NOT_SHOWN, id=f"steady.ttft.{kind}", scenario="steady"))
        scan = scan.model_copy(update={"quantile": None})
        assert not_shown_phrase(scan).startswith(f"TTFT {kind} in steady within +10%")
    other = check_doc(replace(ERRORS, decision="undecided", required=False))
    assert not_shown_phrase(other) == ERRORS.message


def test_the_line_fits_140_characters_and_counts_what_does_not_fit() -> None:
    checks = [check_doc(SLOWER), *_not_shown(5)]
    said = summarize("continue", checks)
    line = said.line()
    assert len(line) <= LINE_CHARS
    assert line.startswith("continue, with 1 warning; not shown: TTFT p90 in s0 within +10%")
    assert line.endswith(" more)")
    assert "(and 4 more)" in line or "(and 3 more)" in line
    # every item is in the list, whatever the line could name
    assert [r.check for r in said.not_shown] == [f"s{i}.ttft.p90" for i in range(5)]
    assert said.line(50) == "continue, with 1 warning; 5 checks not shown"
    clipped = said.line(30)  # not even the count fits: clipped, never past the limit
    assert clipped == "continue, with 1 warning; 5..." and len(clipped) == 30


def test_a_hold_line_names_as_many_failed_checks_as_fit() -> None:
    failed = [check_doc(replace(FAILED, id=f"scenario-{i}.ttft.p50")) for i in range(12)]
    line = summarize("hold", failed).line()
    assert len(line) <= LINE_CHARS
    assert line.startswith("hold: 12 checks failed (scenario-0.ttft.p50, ")
    assert line.endswith(" more)")
    assert summarize("hold", failed).line(30) == "hold: 12 checks failed"


def test_a_hold_without_checks_says_why_in_one_line() -> None:
    reasons = [
        ReasonDoc(check="gate.deadline", message="gate deadline of 60 s passed\nduring load"),
        ReasonDoc(check="gate.other", message="x"),
    ]
    assert summarize("hold", [], reasons).line() == (
        "hold: gate deadline of 60 s passed during load (and 1 more)"
    )
    assert summarize("hold", []).line() == "hold"


def test_an_old_document_reads_and_says_what_a_new_one_says() -> None:
    """Stored before this version: 'inconclusive', no summary, warnings or not_shown keys."""
    stored = old_document()
    assert "summary" not in stored and "not_shown" not in stored
    assert {c["decision"] for c in stored["checks"]} == {"pass", "inconclusive"}
    doc = VerdictDocument.read(stored)
    written = doc.to_json()  # written again: the keys it had, its check now 'undecided'
    assert list(written) == list(stored)
    assert [c["decision"] for c in written["checks"]] == ["undecided", "pass", "pass", "pass"]
    assert doc.summary is None and doc.warnings == [] and doc.not_shown == []
    said = summary_of(doc)  # from its checks
    assert said.line() == (
        "continue; not shown: TTFT p90 in steady within +10% (shown: at most +14%)"
    )
    assert said.banner == "CONTINUE"
    raw = stored_summary("continue", stored)  # the store's path: only checks and reasons read
    assert raw.line() == said.line() and raw.not_shown == said.not_shown


def test_stored_summary_falls_back_to_the_rows_reason() -> None:
    assert stored_summary("hold", None, "gate said hold").line() == "hold: gate said hold"
    unreadable = {"checks": [{"id": "x"}], "reasons": []}  # a check without a decision
    assert stored_summary("hold", unreadable, "why").line() == "hold: why"
    assert stored_summary("continue", None, None).line() == "continue"


def test_bounded_keeps_the_first_and_counts_the_rest() -> None:
    items = [ReasonDoc(check=str(i), message="m") for i in range(25)]
    kept, omitted = bounded(items, 20)
    assert [r.check for r in kept] == [str(i) for i in range(20)] and omitted == 5
    assert bounded(items[:3], 20) == (items[:3], 0)
