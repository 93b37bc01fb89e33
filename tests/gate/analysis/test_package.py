"""The judge's package loads its modules on first use (gate/analysis/__init__.py): the command
line and the spec, which read only `gate.analysis.policy`, must not pay for scipy.stats (it was
1.3 s of every `gate` command's 2 s start-up)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import gate.analysis


def test_the_cli_and_the_spec_start_without_scipy_stats() -> None:
    probe = "import sys, gate.cli, gate.spec; print('scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_every_public_name_resolves_to_its_module() -> None:
    # even once every submodule is imported (a submodule's name shadows a package attribute)
    for info in pkgutil.iter_modules(gate.analysis.__path__):
        importlib.import_module(f"gate.analysis.{info.name}")
    for name in gate.analysis.__all__:
        value = getattr(gate.analysis, name)
        assert getattr(value, "__name__", name) == name or name == "quantile_key", name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = gate.analysis.no_such_name
