"""`gate calibrate`: simulate many gates and print how both judges do on them.

The simulation and both judges are pure (gate/analysis/calibration.py); this module only reads
the options, draws the progress bar on stderr and prints the table or the JSON document.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gate.analysis.calibration import (
    CASES,
    GRID_CASES,
    GRID_SIZES,
    MODELS,
    Calibration,
    Case,
    GridCell,
    SimConfig,
    calibrate,
    calibrate_grid,
)
from gate.analysis.calibration_numerics import (
    NUMERICS_CASES,
    NumericsCase,
    NumericsResult,
    calibrate_numerics,
)
from gate.analysis.calibration_shapes import (
    BOUNDARY_CASES,
    EPISODE_CASES,
    POWER_CASES,
    SHAPE_SIZES,
    STRESS,
    ShapeCell,
    calibrate_shapes,
    short_plan_refusal,
)
from gate.analysis.policy import Policy
from gate.calibrate_engines import (
    ENGINE_CASES,
    RATE,
    REQUESTS,
    VLLM_CASES,
    VLLM_RATE,
    VLLM_REQUESTS,
    EngineCase,
    EngineCaseResult,
    EngineKind,
    calibrate_engines,
    spec_for,
    vllm_home,
)

DEFAULT_RUNS = 20
"""About two minutes on two busy cores (~0.5 s per simulated gate, 12 cases); enough to see the
power of each case, not to pin a 1% false-hold rate: use --runs 500 for that."""


def _progress(err: Console) -> Progress:
    """The simulations' progress bar on stderr, gone when they end."""
    return Progress(
        TextColumn("  simulating [bold]{task.description}[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


def _ticker(bar: Progress, name: str, total: int) -> Callable[[str], None]:
    """A task of `total` steps on the bar, and what advances it one step naming the case."""
    task = bar.add_task(name, total=total)

    def step(case: str) -> None:
        bar.update(task, advance=1, description=case)

    return step


def _fmt_rate(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _fmt_n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _table(result: Calibration) -> Table:
    table = Table(
        title=(
            f"calibration: {result.runs} simulated gates per case, alpha {result.alpha:g}, "
            f"limit {result.limit:,} requests per arm"
        )
    )
    table.add_column("case")
    table.add_column("hold", justify="right")
    table.add_column("fail", justify="right")
    table.add_column("inconcl.", justify="right")
    table.add_column("by 10k", justify="right")
    table.add_column("median n", justify="right")
    table.add_column("baseline hold", justify="right")
    table.add_column("by 10k", justify="right")
    table.add_column("median n", justify="right")
    for c in result.cases:
        table.add_row(
            c.name,
            _fmt_rate(c.hold_rate),
            _fmt_rate(c.fail_rate),
            _fmt_rate(c.inconclusive_rate),
            _fmt_rate(c.hold_rate_10k),
            _fmt_n(c.median_requests_to_hold),
            _fmt_rate(c.baseline_hold_rate),
            _fmt_rate(c.baseline_hold_rate_10k),
            _fmt_n(c.baseline_median_requests_to_hold),
        )
    return table


def _engine_rate_problems(rate: float, kind: EngineKind = "sim") -> str:
    """What the plan refuses in an --engines gate's spec at this rate (a steady scenario too
    short for the paired checks), else ''."""
    from gate.core.limits import Limits
    from gate.runs.schedules import plan_problems
    from gate.spec import parse_spec

    spec = parse_spec(spec_for(ENGINE_CASES[0], 0, seed=0, rate=rate, kind=kind), "calibration")
    return "; ".join(p.message for p in plan_problems(spec, Limits()))


def _vllm_bed_missing() -> str:
    """Why the real-vLLM test bed cannot serve --engines vllm, else ''."""
    home = vllm_home()
    need = [home / "venv" / "bin" / "python", *(home / "models" / m for m in ("tiny-a", "tiny-b"))]
    missing = [str(p) for p in need if not p.exists()]
    if missing:
        return (
            f"the real-vLLM test bed is not built ({missing[0]} is missing): run `make vllm` "
            "(bench/vllm/setup), or point GATE_VLLM_HOME at one"
        )
    return ""


def run_calibration(
    runs: int | None,
    seed: int,
    as_json: bool,
    limit: int | None = None,
    case_names: Sequence[str] | None = None,
    engine_runs: int = 0,
    engine_rate: float | None = RATE,
    numerics_runs: int = 0,
    engine_kind: EngineKind = "sim",
) -> int:
    """Simulate `runs` gates per case at the default policy (every case, or those named),
    and `engine_runs` whole gates per engine case against real engines (--engines: the sim,
    or real vLLM); print the result; exit code 0 (2 for a bad option)."""
    runs = DEFAULT_RUNS if runs is None else runs
    vllm = engine_kind == "vllm"
    engine_rate = (VLLM_RATE if vllm else RATE) if engine_rate is None else engine_rate
    problem = _option_problem(runs, numerics_runs, engine_runs, engine_rate, engine_kind, limit)
    selected = _selected_cases(case_names, vllm)
    if problem is not None or isinstance(selected, str):
        print(f"gate: {problem or selected}", file=sys.stderr)
        return 2
    cases, engine_cases, numerics_cases = selected
    config = SimConfig() if limit is None else replace(SimConfig(), limit=limit)
    policy = Policy()
    err = Console(stderr=True, highlight=False)
    with _progress(err) as bar:
        step = _ticker(bar, "gates", runs * len(cases))
        result = calibrate(policy, runs, seed=seed, config=config, cases=cases, progress=step)
        numerics: list[NumericsResult] = []
        if numerics_runs and numerics_cases:
            numerics = calibrate_numerics(
                policy,
                numerics_runs,
                seed=seed,
                cases=numerics_cases,
                progress=_ticker(bar, "numerics", numerics_runs * len(numerics_cases)),
            )
    engines = []
    if engine_runs:
        engines = calibrate_engines(
            engine_runs,
            seed=seed,
            cases=engine_cases,
            progress=lambda m: err.print(m, markup=False),
            rate=engine_rate,
            kind=engine_kind,
        )
    if as_json:
        doc = result.to_dict()
        if numerics:
            doc["numerics"] = {
                "runs": numerics_runs,
                "reference": "deterministic (an envelope of zero)",
                "cases": [c.to_dict() for c in numerics],
            }
        if engine_runs:
            doc["engines"] = {
                "kind": engine_kind,
                "runs": engine_runs,
                "requests_planned": (VLLM_REQUESTS if vllm else REQUESTS) - policy.warmup_requests,
                "rate": engine_rate,
                "baseline_metrics": ["ttft", "itl", "errors"],
                "cases": [c.to_dict() for c in engines],
            }
        print(json.dumps(doc, indent=2))
    else:
        _print_tables(
            result, numerics, numerics_runs, engines, engine_runs, engine_rate, engine_kind
        )
    return 0


def _option_problem(
    runs: int,
    numerics_runs: int,
    engine_runs: int,
    engine_rate: float,
    engine_kind: EngineKind,
    limit: int | None,
) -> str | None:
    """The first bad option, said as the command line says it; None when all are good."""
    if runs < 1:
        return "--runs must be at least 1"
    if numerics_runs < 0:
        return "--numerics-runs must be 0 or more"
    if engine_runs < 0:
        return "--engine-runs must be at least 1"
    if not 0.0 < engine_rate <= 1_000.0:
        return f"--engine-rate must be in (0, 1000], got {engine_rate:g}"
    if engine_runs and engine_kind == "vllm" and (missing := _vllm_bed_missing()):
        return f"--engines vllm: {missing}"
    if engine_runs and (short := _engine_rate_problems(engine_rate, engine_kind)):
        # Every gate would be refused before its load: say so once, not per gate.
        return f"--engine-rate {engine_rate:g}: {short}"
    if limit is not None and limit < 500:
        return "--limit must be at least 500 (one look)"
    return None


def _selected_cases(
    case_names: Sequence[str] | None, vllm: bool
) -> tuple[list[Case], list[EngineCase], list[NumericsCase]] | str:
    """The simulated, engine and numerics cases to run (every one, or those named), or what
    is wrong with a name."""
    all_engine_cases = VLLM_CASES if vllm else ENGINE_CASES
    if not case_names:
        return list(CASES), list(all_engine_cases), list(NUMERICS_CASES)
    names = {c.name for c in CASES} | {c.name for c in all_engine_cases}
    names |= {c.name for c in NUMERICS_CASES}
    unknown = [n for n in case_names if n not in names]
    if unknown:
        known = ", ".join(repr(n) for n in sorted(names))
        return f"--case: no case {unknown[0]!r} (cases: {known})"
    wanted = dict.fromkeys(case_names)
    return (
        [c for c in CASES if c.name in wanted],
        [c for c in all_engine_cases if c.name in wanted],
        [c for c in NUMERICS_CASES if c.name in wanted],
    )


def _print_tables(
    result: Calibration,
    numerics: Sequence[NumericsResult],
    numerics_runs: int,
    engines: Sequence[EngineCaseResult],
    engine_runs: int,
    engine_rate: float,
    engine_kind: EngineKind,
) -> None:
    # A pipe gets 80 columns from rich; the table needs about 110 to stay on one line a row.
    width = None if sys.stdout.isatty() else 120
    Console(highlight=False, width=width).print(_table(result))
    aa = result.aa
    if aa is not None:
        print(
            f"A/A false holds: {_fmt_rate(aa.hold_rate)} ({_fmt_rate(aa.fail_rate)} on a "
            f"failed check, {_fmt_rate(aa.inconclusive_rate)} inconclusive at the limit); "
            f"baseline {_fmt_rate(aa.baseline_hold_rate)}."
        )
    if numerics:
        Console(highlight=False, width=width).print(_numerics_table(numerics, numerics_runs))
    if engines:
        Console(highlight=False, width=width).print(
            _engine_table(engines, engine_runs, engine_rate, engine_kind)
        )


def _numerics_table(results: Sequence[NumericsResult], runs: int) -> Table:
    table = Table(
        title=(
            f"numerics: {runs} simulated gates per case against a deterministic reference "
            "(default correctness stage + 500 mirrored load pairs)"
        )
    )
    table.add_column("case")
    table.add_column("expect")
    table.add_column("hold", justify="right")
    table.add_column("correctness off", justify="right")
    table.add_column("target", justify="right")
    for r in results:
        table.add_row(
            r.name,
            r.expect,
            _fmt_rate(r.hold_rate),
            _fmt_rate(r.outputs_hold_rate),
            ">= 99% " + ("met" if r.meets_target else "MISSED"),
        )
    return table


def _engine_table(
    engines: Sequence[EngineCaseResult], runs: int, rate: float = RATE, kind: EngineKind = "sim"
) -> Table:
    what, requests = (
        ("real vLLM servers", VLLM_REQUESTS) if kind == "vllm" else ("real sim engines", REQUESTS)
    )
    table = Table(
        title=(
            f"whole gates against {what}: {runs} per case, "
            f"{requests} requests at {rate:g}/s planned (baseline: TTFT, ITL, errors)"
        )
    )
    for col in ("case", "hold", "median n", "baseline hold", "median n", "holding checks"):
        table.add_column(col, justify="left" if col in ("case", "holding checks") else "right")
    for c in engines:
        d = c.to_dict()
        table.add_row(
            c.name,
            _fmt_rate(d["hold_rate"]),
            _fmt_n(d["median_requests_to_hold"]),
            _fmt_rate(d["baseline_hold_rate"]),
            _fmt_n(d["baseline_median_requests_to_hold"]),
            ", ".join(f"{k} x{v}" for k, v in d["reasons"].items()) or "-",
        )
    return table


def _grid_options_bad(runs: int, aa_runs: int | None, sizes: Sequence[int]) -> bool:
    """Say on stderr what is wrong with a grid's options (--grid, --shapes), if anything."""
    if runs < 1 or (aa_runs is not None and aa_runs < 1):
        print("gate: --runs and --aa-runs must be at least 1", file=sys.stderr)
        return True
    bad = [n for n in sizes if n < 500]
    if bad:
        print(f"gate: --sizes: {bad[0]} is below 500 (one look)", file=sys.stderr)
        return True
    return False


def run_grid(
    runs: int | None,
    aa_runs: int | None,
    seed: int,
    as_json: bool,
    sizes: Sequence[int] | None = None,
    errors_size: int | None = 5_000,
) -> int:
    """`gate calibrate --grid`: every dependence model at every planned size, and the errors
    cells (issue 17)."""
    runs = DEFAULT_RUNS if runs is None else runs
    sizes = list(GRID_SIZES) if sizes is None else sizes
    if _grid_options_bad(runs, aa_runs, sizes):
        return 2
    policy = Policy()
    per_cell = (aa_runs or runs) + runs * (len(GRID_CASES) - 1)
    errors_gates = 2 * ((aa_runs or runs) + runs) if errors_size else 0
    err = Console(stderr=True, highlight=False)
    with _progress(err) as bar:
        total = per_cell * len(MODELS) * len(sizes) + errors_gates
        cells = calibrate_grid(
            policy,
            runs,
            seed=seed,
            sizes=sizes,
            aa_runs=aa_runs,
            progress=_ticker(bar, "gates", total),
            errors_size=errors_size,
        )
    if as_json:
        print(json.dumps({"alpha": policy.alpha, "grid": [c.to_dict() for c in cells]}, indent=2))
        return 0
    width = None if sys.stdout.isatty() else 140
    Console(highlight=False, width=width).print(_grid_table(cells))
    return 0


def _grid_table(cells: Sequence[GridCell]) -> Table:
    table = Table(title="calibration grid: share of gates held, ours / baseline")
    table.add_column("model")
    table.add_column("n", justify="right")
    for case in GRID_CASES:
        table.add_column(case.name, justify="right")
    table.add_column("A/A n to verdict (median, p90)", justify="right")
    for cell in cells:
        by = {c.name: c for c in cell.calibration.cases}
        name = cell.model.name if cell.errors is None else f"errors {cell.errors}"
        row = [name, f"{cell.limit:,}"]
        for case in GRID_CASES:
            c = by.get(case.name)
            row.append(
                "-"
                if c is None
                else f"{_fmt_rate(c.hold_rate)} / {_fmt_rate(c.baseline_hold_rate)}"
            )
        aa = by[GRID_CASES[0].name]
        row.append(f"{_fmt_n(aa.median_requests_to_verdict)}, {_fmt_n(aa.p90_requests_to_verdict)}")
        table.add_row(*row)
    return table


def run_shapes(
    runs: int | None,
    aa_runs: int | None,
    seed: int,
    as_json: bool,
    sizes: Sequence[int] | None = None,
) -> int:
    """`gate calibrate --shapes`: judge v3 where it is weakest (calibration_shapes.py)."""
    runs = DEFAULT_RUNS if runs is None else runs
    sizes = list(SHAPE_SIZES) if sizes is None else sizes
    if _grid_options_bad(runs, aa_runs, sizes):
        return 2
    policy = Policy()
    per_size = (aa_runs or runs) * len(BOUNDARY_CASES) * len(STRESS) + runs * (
        len(POWER_CASES) + len(EPISODE_CASES)
    )
    err = Console(stderr=True, highlight=False)
    with _progress(err) as bar:
        cells = calibrate_shapes(
            policy,
            runs,
            aa_runs=aa_runs,
            seed=seed,
            sizes=sizes,
            progress=_ticker(bar, "gates", per_size * len(sizes)),
        )
    refusal = short_plan_refusal(policy)
    if as_json:
        doc = {
            "alpha": policy.alpha,
            "short_plan": {"planned": 120, "rate": 20.0, "refused": refusal},
            "cells": [c.to_dict() for c in cells],
        }
        print(json.dumps(doc, indent=2))
        return 0
    width = None if sys.stdout.isatty() else 140
    Console(highlight=False, width=width).print(_shapes_table(cells))
    print(f"planned 120 requests at 20/s: {refusal or 'accepted'}")
    return 0


def _shapes_table(cells: Sequence[ShapeCell]) -> Table:
    table = Table(
        title="judge v3: share of gates held, ours / baseline (median requests to a verdict)"
    )
    for col in ("stress", "n", "kind", "case", "held: ours / baseline", "n to verdict"):
        table.add_column(col, justify="left" if col in ("stress", "kind", "case") else "right")
    for cell in cells:
        for c in cell.calibration.cases:
            table.add_row(
                cell.stress,
                f"{cell.limit:,}",
                cell.kind,
                c.name,
                f"{_fmt_rate(c.hold_rate)} / {_fmt_rate(c.baseline_hold_rate)}",
                _fmt_n(c.median_requests_to_verdict),
            )
    return table


def shapes_markdown(doc: dict[str, object]) -> str:
    """The README's tables from a `gate calibrate --shapes --json` document (so the tables are
    regenerated by a command, never edited by hand)."""
    cells = doc["cells"]
    assert isinstance(cells, list)
    lines = []
    validity = [c for c in cells if c["kind"] == "validity"]
    power = [c for c in cells if c["kind"] == "power"]
    names = [c["name"] for c in validity[0]["cases"]] if validity else []
    lines.append(
        "| stress | n | "
        + " | ".join(f"{n}: ours / baseline" for n in names)
        + " | A/A requests to a verdict (median) |"
    )
    lines.append("|---|---|" + "---|" * len(names) + "---|")
    for c in validity:
        by = {x["name"]: x for x in c["cases"]}
        row = [c["stress"], f"{c['limit']:,}"]
        for n in names:
            x = by[n]
            row.append(
                f"{100 * x['hold_rate']:.1f}% / {100 * x['baseline_hold_rate']:.1f}% ({x['runs']})"
            )
        row.append(_fmt_n(by[names[0]]["median_requests_to_verdict"]))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("| case | n | held: ours / baseline | requests to a verdict, ours (median) |")
    lines.append("|---|---|---|---|")
    for c in power:
        for x in c["cases"]:
            lines.append(
                f"| {x['name']} ({c['stress']}) | {c['limit']:,} | "
                f"{100 * x['hold_rate']:.1f}% / {100 * x['baseline_hold_rate']:.1f}% "
                f"({x['runs']}) | {_fmt_n(x['median_requests_to_verdict'])} |"
            )
    short = doc.get("short_plan")
    if isinstance(short, dict):
        lines.append("")
        lines.append(
            f"Planned {short['planned']} requests at {short['rate']:g}/s: "
            + (f"refused before the load: {short['refused']}" if short["refused"] else "accepted")
        )
    return "\n".join(lines)
