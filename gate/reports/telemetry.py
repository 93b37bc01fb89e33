"""The engines' own series in the report: per scenario, one chart per metric with both
engines on shared axes over the scenario's seconds, its phases shaded; and each engine's
configuration as its metrics state it (for its card).

A chart is a row of `PANELS` (the metric in the gate's vocabulary, gate/telemetry, its title,
unit and scale); a metric neither engine reported has no chart. GPU series (memory, power)
are rows like any other once their sources sample them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from markupsafe import Markup

from gate.core.vocabulary import ROLES
from gate.reports.charts import COLORS, Line, line_chart
from gate.verdict.document import EngineTelemetryDoc, ScenarioDoc, TelemetryDoc

__all__ = ["PANELS", "Panel", "engine_config", "telemetry_charts"]


@dataclass(frozen=True)
class Panel:
    metric: str
    title: str
    unit: str
    scale: float = 1.0


PANELS: tuple[Panel, ...] = (
    Panel("requests_waiting", "queue depth", "requests waiting"),
    Panel("requests_running", "running batch", "requests running"),
    Panel("kv_cache_usage", "KV cache use", "% of the KV cache", 100.0),
    Panel("preemptions_total", "preemptions", "preemptions so far"),
    Panel("gpu_memory_used_bytes", "GPU memory", "GiB", 1.0 / 2**30),
    Panel("gpu_power_watts", "GPU power", "W"),
)

CONFIG_WORDS = (
    ("kv_cache_blocks", "kv_cache_blocks"),
    ("block_size", "block size"),
    ("kv_cache_tokens", "KV tokens"),
    ("cache_dtype", "cache dtype"),
    ("prefix_caching", "prefix caching"),
    ("gpu_model", "GPU model"),
    ("gpu_count", "GPUs read"),
    ("gpu_driver", "GPU driver"),
)


def _line(role: str, eng: EngineTelemetryDoc | None, panel: Panel) -> Line | None:
    if eng is None or panel.metric not in eng.series:
        return None
    y = np.array(
        [np.nan if v is None else v * panel.scale for v in eng.series[panel.metric]], dtype=float
    )
    if not np.isfinite(y).any():
        return None
    return Line(role, COLORS[role], np.array(eng.t_s, dtype=float), y, dash=role == "candidate")


def telemetry_charts(
    name: str, tel: TelemetryDoc | None, phases: Sequence[tuple[str, float]] = ()
) -> list[Markup]:
    """One chart per panel either engine reported, both engines on the same axes."""
    if tel is None:
        return []
    out = []
    for panel in PANELS:
        lines = [ln for role in ROLES if (ln := _line(role, tel.of(role), panel)) is not None]
        if not lines:
            continue
        out.append(
            Markup(
                line_chart(
                    lines,
                    f"{name}: {panel.title} (engine metrics)",
                    f"seconds into scenario (a scrape every {tel.interval_s:g} s)",
                    panel.unit,
                    phases,
                    kind="telemetry",
                    desc=f"{panel.title} as each engine's metrics report it over the scenario",
                )
            )
        )
    return out


def engine_config(scenarios: Sequence[ScenarioDoc], role: str) -> list[tuple[str, str]]:
    """The engine's configuration as its metrics stated it (the first scenario that has it)."""
    for sc in scenarios:
        eng = sc.telemetry.of(role) if sc.telemetry is not None else None
        if eng is not None and eng.config:
            return [(words, eng.config[key]) for key, words in CONFIG_WORDS if key in eng.config]
    return []
