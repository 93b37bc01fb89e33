"""Deprecated entry points of the sim engine, which is its own package now: `simengine`.

Specs written before the move start ``python -m gate.engines.sim`` and
``python -m gate.engines.sim.router``; these forward to ``python -m simengine`` and
``python -m simengine.router`` with one line on stderr, and nothing else lives here.
"""

from __future__ import annotations

import runpy
import sys


def forward(old: str, new: str) -> None:
    print(f"`python -m {old}` is deprecated: run `python -m {new}`", file=sys.stderr, flush=True)
    runpy.run_module(new, run_name="__main__", alter_sys=True)
