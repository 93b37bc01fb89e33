"""How the report writes a value: numbers, durations, times, percentages, ratios.

One home for the formatters the report's view data and its Jinja2 filters share; each takes
whatever the document holds (None, a non-finite float) and writes a dash (or nothing) for a
value that is missing.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any


def num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}" if math.isfinite(v) else str(v)
    return str(v)


def seconds(v: Any) -> str:
    """A duration to the tenth of a second, in minutes and seconds from two minutes on."""
    if not isinstance(v, int | float) or not math.isfinite(v):
        return "–"
    if v >= 120:
        return f"{int(v // 60)} min {v % 60:02.0f} s"
    return f"{v:.1f} s"


def format_time(v: Any) -> str:
    """An ISO timestamp (or datetime) as `2026-11-30 11:51:04 UTC`; anything else as is."""
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v)
        except ValueError:
            return str(v)
    if isinstance(v, datetime):
        if v.tzinfo is None:
            return v.strftime("%Y-%m-%d %H:%M:%S UTC")
        return v.strftime("%Y-%m-%d %H:%M:%S %Z").replace("+00:00", "UTC")
    return "–" if v is None else str(v)


def pct(v: Any) -> str:
    return f"{v * 100:.2f}%" if isinstance(v, int | float) and math.isfinite(v) else "–"


def ms(v: Any) -> str:
    if not isinstance(v, int | float) or not math.isfinite(v):
        return "–"
    return f"{v:,.2f} ms" if abs(v) < 10 else f"{v:,.1f} ms"


def seconds_fine(v: Any) -> str:
    """A duration to the hundredth of a second (startup and recovery times)."""
    return f"{v:,.2f} s" if isinstance(v, int | float) and math.isfinite(v) else "–"


def points(v: Any) -> str:
    """A difference of two fractions, in percentage points."""
    return f"{v * 100:.1f} pts" if isinstance(v, int | float) and math.isfinite(v) else "–"


def ratio_x(v: Any) -> str:
    """A candidate-to-reference ratio, `1.042x`."""
    return f"{v:.3f}x" if isinstance(v, int | float) and math.isfinite(v) else ""
