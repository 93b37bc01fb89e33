"""The README's verdict example is what `gate demo` prints today (issue 31): the test runs the
real demo (two sim engine processes, real HTTP, SQLite) and compares its verdict block with the
README's, on what a seeded demo prints the same every run (tests/support/readme_verdict.py
says what that is). A stale example fails here; `make readme-verdict` writes it again."""

from __future__ import annotations

from pathlib import Path

import pytest
from readme_verdict import README, readme_block, run_demo, structure, verdict_block, with_block

BLOCK = """checks
┏━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━┓
┃ check           ┃ decision  ┃  ratio ┃    interval ┃ threshold ┃ samples ┃
┡━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━┩
│ steady.ttft.p50 │ fail      │ 1.426x │ 1.411-1.430 │    1.050x │ 500/500 │
│ steady.ttft.p90 │ undecided │ 1.423x │             │    1.100x │ 500/500 │
│ crash.reference │ pass      │        │             │           │     0/0 │
└─────────────────┴───────────┴────────┴─────────────┴───────────┴─────────┘
note: steady stopped early at 500 of 792 planned requests per arm.

HOLD  gate 3d272b14c787491a841316bc89baa66f
  - steady.ttft.p50: TTFT p50 in steady is 1.43x the reference (interval 1.41x-1.43x).
report: /tmp/x/reports/demo-ttft-regression-3d272b14.html
"""


# timed_gate: when the demo's sequential test stops, and whether its engines start inside the
# startup thresholds, rest on timing; beside the real-vLLM tests both ran differ twice in a row
@pytest.mark.slow
@pytest.mark.timed_gate
def test_the_readme_shows_the_verdict_the_demo_prints(tmp_path: Path) -> None:
    """One run that prints another structure is run again: a stale example differs every
    time, while a machine busy enough to slow one engine's start past a startup threshold
    (other tests share the cores) rarely does so twice."""
    shown = structure(readme_block(README.read_text(encoding="utf-8")))
    printed: list[str] = []
    for attempt in range(2):
        run = run_demo(tmp_path / f"run{attempt}")
        assert run.returncode == 0, run.stderr
        printed = structure(verdict_block(run.stderr))
        if printed == shown:
            return
    assert printed == shown, (
        "README.md's verdict example is stale: `make readme-verdict` writes it again"
    )


def test_what_is_compared() -> None:
    """Figures and the gate id are not compared; ids, failures, units, words are."""
    s = structure(BLOCK)
    assert s == [
        "checks",
        "steady.ttft.p50 fail #x #/#",
        "steady.ttft.p90 did not fail #x #/#",
        "crash.reference did not fail  #/#",
        "note: steady stopped early at # of # planned requests per arm.",
        "banner HOLD",
        "  - steady.ttft.p50: TTFT p50 in steady is #x the reference (interval #x-#x).",
        "report: PATH",
    ]
    warned = BLOCK.replace(
        "report:",
        "  warning   steady.ttft.creep: past its 1.10x threshold but not with confidence\nreport:",
    )
    assert structure(warned) == s  # a warning is the run's noise, like pass or undecided
    other_run = BLOCK.replace("1.426x", "1.391x").replace("undecided", "pass     ")
    assert structure(other_run) == s
    assert structure(BLOCK.replace("│ fail     ", "│ undecided")) != s
    assert structure(BLOCK.replace("crash.reference", "crash.candidate")) != s
    assert structure(BLOCK.replace("HOLD", "CONTINUE")) != s


def test_the_block_is_written_between_the_markers() -> None:
    text = "intro\n<!-- verdict:start -->\n```text\nold\n```\n<!-- verdict:end -->\nafter\n"
    new = with_block(text, "new\n")
    assert readme_block(new) == "new\n"
    assert new.startswith("intro\n") and new.endswith("\nafter\n")
    shown = verdict_block("progress\nchecks\n" + BLOCK.split("\n", 1)[1] + "tail\n")
    assert shown.endswith("report: .gate/reports/demo-ttft-regression-3d272b14.html\n")
