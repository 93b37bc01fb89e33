"""The grammar of latency check keys, shared by `require`, `detect` and `advisory`:
'ttft.p50', 'itl.tail', 'ttft.window', or 'p90' / 'tail' for every metric. Pure."""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "QUANTILE_KEY",
    "SHAPE_KINDS",
    "Metric",
    "check_key",
    "key_problem",
    "matches_key",
    "quantile_key",
]

QUANTILE_KEY = re.compile(r"^p(\d+(?:\.\d+)?)$")


def quantile_key(q: float) -> str:
    """The tolerance key of a quantile: 0.5 -> "p50", 0.99 -> "p99", 0.999 -> "p99.9"."""
    return f"p{round(q * 100.0, 6):g}"


Metric = Literal["ttft", "itl", "e2e"]


SHAPE_KINDS: tuple[str, ...] = ("tail", "window", "creep")
"""Latency checks that are not one quantile: the slow tail, a slow window, a creep."""


def check_key(metric: str, q: float | None, kind: str = "tail") -> str:
    """The key of a latency check in `require` and `detect`: 'ttft.p50', 'itl.tail',
    'ttft.window', 'ttft.creep' (q None: the `kind`)."""
    return f"{metric}.{kind if q is None else quantile_key(q)}"


def key_problem(key: str) -> str | None:
    """What is wrong with a key, or None."""
    metric, dot, what = key.rpartition(".")
    if not dot:
        metric, what = "", key
    if metric and metric not in ("ttft", "itl", "e2e"):
        return f"{key!r}: unknown metric {metric!r}; expected ttft, itl or e2e"
    if what not in SHAPE_KINDS:
        m = QUANTILE_KEY.match(what)
        if m is None or not 0.0 < float(m.group(1)) < 100.0:
            return (
                f"{key!r} is not a check key like 'ttft.p50', 'itl.p90', 'tail', 'window', "
                "'creep' or 'p90'"
            )
    return None


def matches_key(keys: list[str], metric: str, q: float | None, kind: str = "tail") -> bool:
    """Whether any of these keys names the latency check of this metric and quantile (None:
    the `kind`)."""
    what = kind if q is None else quantile_key(q)
    for key in keys:
        m, dot, w = key.rpartition(".")
        if not dot:
            m, w = "", key
        if w not in SHAPE_KINDS:
            w = quantile_key(float(w[1:]) / 100.0)
        if w == what and m in ("", metric):
            return True
    return False
