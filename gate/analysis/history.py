"""Is this run's reference like its history? Pure: figures in, outliers out.

The reference engine of a spec is the one already in production, so across gates of one
identity (name, model, shape) its own figures (TTFT and ITL p50/p99 per scenario) should stay
put. When they move far from their history the test bed changed (another node, a noisy
neighbour, a driver), not the software under test: the gate says so in its notes and its
document (`history`), and still judges the candidate against this run's reference, since
both engines ran on the same bed at the same instants.

The comparison is robust: the median and the median absolute deviation (MAD) of the last
`HISTORY_WINDOW` gates' values, and the modified z-score of Iglewicz and Hoaglin,
`(value - median) / (1.4826 MAD)` (1.4826 makes the MAD a standard deviation under normal
noise), flagged past `OUTLIER_SCORE` = 3.5, their recommended cut. A single earlier outlier
moves neither the median nor the MAD much, which the mean and standard deviation would. Two
guards: fewer than `MIN_HISTORY` earlier values say nothing (a note says so), and the scale is
floored at `MIN_RELATIVE_SPREAD` of the median, because a very steady history (a MAD near 0)
would otherwise flag a change of a few percent that no one would call a new test bed: at the
floor a figure must move more than 3.5 x 5% = 17.5% to be flagged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

HISTORY_WINDOW = 20
MIN_HISTORY = 5
OUTLIER_SCORE = 3.5
MIN_RELATIVE_SPREAD = 0.05
MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class Outlier:
    figure: str
    value: float
    median: float
    mad: float
    score: float


@dataclass(frozen=True)
class ReferenceComparison:
    """What the history says of this run's reference: how many earlier gates it was compared
    with, how many figures, and which figures are far from their history."""

    gates: int
    figures: int
    outliers: tuple[Outlier, ...]

    @property
    def enough(self) -> bool:
        return self.gates >= MIN_HISTORY


def robust_score(value: float, past: Sequence[float]) -> Outlier:
    """`value` against `past` (module docstring); `figure` is left empty."""
    med = median(past)
    mad = median(abs(x - med) for x in past)
    scale = max(MAD_TO_SD * mad, MIN_RELATIVE_SPREAD * abs(med), 1e-12)
    return Outlier("", value, med, mad, (value - med) / scale)


def compare_reference(
    current: Mapping[str, float],
    history: Sequence[Mapping[str, float]],
    *,
    window: int = HISTORY_WINDOW,
) -> ReferenceComparison:
    """This run's reference figures against the last `window` gates' (newest first in
    `history`). A figure is compared when at least MIN_HISTORY earlier gates have it."""
    recent = list(history[:window])
    outliers, compared = [], 0
    for figure, value in sorted(current.items()):
        past = [h[figure] for h in recent if figure in h and math.isfinite(h[figure])]
        if not math.isfinite(value) or len(past) < MIN_HISTORY:
            continue
        compared += 1
        o = robust_score(value, past)
        if abs(o.score) > OUTLIER_SCORE:
            outliers.append(Outlier(figure, value, o.median, o.mad, o.score))
    return ReferenceComparison(len(recent), compared, tuple(outliers))
