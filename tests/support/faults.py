"""The fault table (issue 16): one row per fault test, filled with what that run observed.

Each fault test ends with `fault_row(...)`, given values it read in that run (the final state
from the gate's document, the GPUs from the lease rows, the orphans from /proc, the gates and
callbacks that went missing), never the strings it expects. The table is written again after
every row, so whichever fault tests a session ran, in whatever folders, the file holds all of
them when the session ends, and nothing needs a session hook or a fixture: a test outside
tests/gate/faults imports this module and calls one function.

Where: `$GATE_FAULT_TABLE` if set, else `.gate/fault-table.md` at the repository root (a
gitignored data directory).

Under pytest-xdist each worker is a process of its own with its own rows, so each process keeps
its rows in a file of its own beside the table (`fault-table.md.rows/SESSION-PID.json`) and
renders the table from every row file of its session, under a lock. The session is xdist's
test run id, shared by all workers of one run; a plain pytest run is a session by itself. Row
files of other sessions are removed when a row is written, so the table holds one session's
rows, as before."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

COLUMNS = ("fault", "what the operator sees", "final state", "GPUs", "orphans", "lost", "test")
MAX_CELL = 220  # characters of one cell: a reason is quoted, not pasted whole


@dataclass(frozen=True, slots=True)
class FaultRow:
    fault: str
    operator_sees: str
    final_state: str
    gpus: str
    orphans: int
    lost: int
    test: str

    def cells(self) -> tuple[str, ...]:
        lost = "nothing" if self.lost == 0 else f"{self.lost} (gates or callbacks missing)"
        return (
            self.fault,
            self.operator_sees,
            self.final_state,
            self.gpus,
            str(self.orphans),
            lost,
            self.test,
        )


_rows: list[FaultRow] = []
_lock = threading.Lock()


def table_path() -> Path:
    chosen = os.environ.get("GATE_FAULT_TABLE")
    if chosen:
        return Path(chosen)
    return Path(__file__).resolve().parents[2] / ".gate" / "fault-table.md"


def _cell(text: str) -> str:
    one_line = " ".join(str(text).split()).replace("|", "\\|")
    return one_line if len(one_line) <= MAX_CELL else one_line[: MAX_CELL - 1] + "…"


def render(rows: list[FaultRow]) -> str:
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def gpus_cell(held_after: int, note: str = "") -> str:
    """The GPUs column: how many GPU lease rows are still held once the fault is over, and
    what else the test saw of them (a second grant of the same GPUs, say)."""
    state = "all released (0 held)" if held_after == 0 else f"{held_after} GPU(s) still held"
    return f"{state}; {note}" if note else state


def fault_row(
    *,
    fault: str,
    operator_sees: str,
    final_state: str,
    gpus: str,
    orphans: int,
    lost: int,
) -> FaultRow:
    """Record one fault test's observations and rewrite the table."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    test = current.rsplit(" (", 1)[0].rsplit("/", 1)[-1]
    row = FaultRow(fault, operator_sees, final_state, gpus, orphans, lost, test)
    with _lock:
        _rows.append(row)
        path = table_path()
        rows_dir = path.with_name(path.name + ".rows")
        rows_dir.mkdir(parents=True, exist_ok=True)
        session = _session()
        mine = rows_dir / f"{session}-{os.getpid()}.json"
        _write(mine, json.dumps([asdict(r) for r in _rows]))
        with (rows_dir / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            everyone: list[FaultRow] = []
            for f in sorted(rows_dir.glob("*.json")):
                if not f.name.startswith(f"{session}-"):
                    f.unlink(missing_ok=True)  # another session's rows
                    continue
                everyone += [FaultRow(**r) for r in json.loads(f.read_text())]
            _write(path, render(everyone))
    print(f"\nFAULT {row.fault}: {row.final_state}; {row.gpus}; orphans {row.orphans}")
    return row


def _session() -> str:
    """One pytest run: xdist's test run id (the same in every worker), else this process."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"run{os.getpid()}"


def _write(path: Path, text: str) -> None:
    """Replace the file whole, so that a reader never sees half of it."""
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_text(text)
    partial.replace(path)
