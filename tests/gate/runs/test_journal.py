"""A gate's state writes survive a database outage: phases are recorded at once and written in
order by their own thread, retried with a log line per failure; one-off writes retry too."""

from __future__ import annotations

import logging
import threading

import pytest

from gate.runs.journal import PhaseJournal, PhaseRow, persist_sync


def test_phases_are_written_in_order_through_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    written: list[PhaseRow] = []
    down = threading.Event()
    down.set()
    failures = {"n": 0}

    def write(row: PhaseRow) -> None:
        if down.is_set():
            failures["n"] += 1
            if failures["n"] >= 3:
                down.clear()  # the database is back after three failed tries
            raise ConnectionError("database unreachable")
        written.append(row)

    journal = PhaseJournal(write, "g" * 32)
    rows = [("gate", f"p{i}", float(i), None) for i in range(20)]
    with caplog.at_level(logging.WARNING, logger="gate.runs"):
        for row in rows:
            journal.record(row)  # never blocks, whatever the database does
        assert journal.flush(30)
    journal.close()
    assert written == rows
    assert failures["n"] == 3
    assert sum("writing phase gate:p0 failed" in r.getMessage() for r in caplog.records) == 3
    assert any("after 3 failed tries" in r.getMessage() for r in caplog.records)


def test_a_write_that_cannot_land_in_its_budget_raises_its_last_error() -> None:
    def never() -> None:
        raise ConnectionError("still down")

    with pytest.raises(ConnectionError, match="still down"):
        persist_sync("the finished gate", never, budget_s=1.0)


def test_flush_says_when_rows_are_still_unwritten() -> None:
    gate = threading.Event()

    def slow(row: PhaseRow) -> None:
        gate.wait(10)

    journal = PhaseJournal(slow, "h" * 32)
    journal.record(("gate", "requested", 0.0, None))
    assert not journal.flush(0.2)
    gate.set()
    assert journal.flush(10)
    journal.close()
