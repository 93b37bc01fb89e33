"""The judge and the allocator are pure cores: importing them pulls in no I/O library."""

from __future__ import annotations

import subprocess
import sys

IO_MODULES = (
    "sqlalchemy",
    "httpx",
    "alembic",
    "rich",
    "gate.core.database",
    "gate.core.settings",
)


def test_pure_cores_import_no_io() -> None:
    code = (
        "import sys\n"
        "import gate.analysis, gate.analysis.judge, gate.reservations.allocator\n"
        "import gate.reservations.groups, gate.reservations.shapes\n"
        "import gate.analysis.calibration, gate.analysis.baseline, gate.analysis.sequential\n"
        f"io = {IO_MODULES!r}\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in io or m in io]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
