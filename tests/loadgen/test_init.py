"""The package surface: everything in ``__all__`` is importable, and ``gate`` never is."""

from __future__ import annotations

import subprocess
import sys


def test_package_surface_and_no_gate_import() -> None:
    code = (
        "import sys, loadgen, loadgen.cli\n"
        "assert not any(m == 'gate' or m.startswith('gate.') for m in sys.modules)\n"
        "missing = [n for n in loadgen.__all__ if not hasattr(loadgen, n)]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
