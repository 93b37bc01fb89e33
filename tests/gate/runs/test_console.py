"""The terminal's verdict (gate/runs/console.py print_summary): a continue says its warnings and
what it could not show under the banner, a hold its reasons; decisions in their colours."""

from __future__ import annotations

import io

from rich.console import Console
from verdicts import ERRORS, SLOWER, mixed_document, old_document

from gate.runs.console import DECISION_STYLE, print_summary
from gate.verdict import VerdictDocument


def _printed(doc: VerdictDocument) -> tuple[str, str]:
    """(the text, the same with ANSI styles) as a 160-column terminal shows it."""
    console = Console(
        file=io.StringIO(),
        width=160,
        record=True,
        highlight=False,
        soft_wrap=True,
        force_terminal=True,
    )
    print_summary(doc, console)
    return console.export_text(styles=False, clear=False), console.export_text(styles=True)


def _after_banner(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("CONTINUE", "HOLD")))
    return lines[start:]


def test_a_continue_lists_its_warnings_and_what_it_did_not_show() -> None:
    text, styled = _printed(mixed_document(hold=False))
    tail = _after_banner(text)
    assert tail[0] == "CONTINUE, with 2 warnings  gate g-mixed"
    assert tail[1:4] == [
        f"  warning   steady.itl.p50: {SLOWER.warning}",
        f"  warning   steady.errors: {ERRORS.warning}",
        "  not shown TTFT p90 in steady within +10% (shown: at most +14%)",
    ]
    assert tail[4] == "report: /r/mixed-g-mixed.html"
    assert "every check passed" not in text.lower() and "inconclusive" not in text
    # the table marks the warned checks; decisions in their colours
    row = next(line for line in text.splitlines() if "steady.errors" in line and "│" in line)
    assert "pass warning" in row
    assert "\x1b[33mundecided" in styled  # yellow
    assert "\x1b[1;32mCONTINUE, with 2 warnings" in styled  # bold green


def test_a_hold_lists_its_reasons_then_its_warnings() -> None:
    text, styled = _printed(mixed_document(hold=True))
    tail = _after_banner(text)
    assert tail[0] == "HOLD  gate g-mixed"
    assert tail[1].startswith("  - steady.ttft.p50: TTFT p50 in steady is 1.43x the reference")
    assert [line.split(":")[0] for line in tail[2:4]] == [
        "  warning   steady.itl.p50",
        "  warning   steady.errors",
    ]
    assert "not shown" not in text  # a hold's reasons say what matters
    assert "\x1b[31mfail" in styled and "\x1b[1;31mHOLD" in styled


def test_an_old_document_prints_undecided_and_what_it_did_not_show() -> None:
    text, _ = _printed(VerdictDocument.read(old_document()))
    assert "inconclusive" not in text
    row = next(line for line in text.splitlines() if "steady.ttft.p90" in line and "│" in line)
    assert "undecided" in row
    tail = _after_banner(text)
    assert tail[0] == "CONTINUE  gate g-old"
    assert tail[1] == "  not shown TTFT p90 in steady within +10% (shown: at most +14%)"


def test_every_decision_has_its_colour() -> None:
    assert DECISION_STYLE == {"pass": "green", "fail": "red", "undecided": "yellow"}


def test_an_engines_log_line_in_a_phase_is_printed_as_text_not_markup() -> None:
    """vLLM's log lines carry "[model.py:733]"; rich read it as a tag and dropped it, and a
    hostile engine could style or hide what the operator reads."""
    from gate.runs.console import ConsoleProgress

    console = Console(file=io.StringIO(), width=200, record=True, highlight=False)
    ConsoleProgress(console).phase(
        "candidate",
        "config_resolved",
        9.3,
        "INFO 12-06 20:00:48 [model.py:733] Resolved architecture: [bold]x[/bold]",
    )
    text = console.export_text(styles=False)
    assert "[model.py:733] Resolved architecture: [bold]x[/bold]" in text
