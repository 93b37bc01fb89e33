"""The terminal face of a running gate: phases as they happen, a progress bar per scenario,
and a summary table at the end. Everything goes to stderr so `--json` keeps stdout clean."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from gate.spec import GateSpec
from gate.verdict.document import CheckDoc, VerdictDocument
from gate.verdict.summary import summary_of

STYLE = {"reference": "blue", "candidate": "dark_orange", "gate": "white"}
# An engine that ended the gate (it died, or never got ready) has its last lines shown under
# the verdict, bounded: its own words are usually the reason (a CUDA error, a bad flag), and
# the report is one more step away. Escape sequences are dropped: an engine's colours are not
# ours to print.
TAIL_LINES = 12
TAIL_CHARS = 300
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])?")
DECISION_STYLE = {"pass": "green", "fail": "red", "undecided": "yellow"}


class ConsoleProgress:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._last_pct = -1

    def start(self, spec: GateSpec) -> None:
        self.console.print(
            f"[bold]gate[/bold] {spec.name}: model [bold]{spec.model}[/bold], "
            f"{len(spec.scenarios)} scenario(s)"
        )

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def phase(self, role: str, phase: str, at_s: float, detail: str | None) -> None:
        style = STYLE.get(role, "white")
        # An engine's words (its log lines, its argv) are text, never markup: "[model.py:733]"
        # in vLLM's log would otherwise vanish as an unknown tag; its escape codes are dropped.
        extra = f"  [dim]{escape(_ESCAPES.sub('', detail))}[/dim]" if detail else ""
        line = f"[dim]{at_s:7.2f}s[/dim] [{style}]{role:<10}[/{style}] {phase}{extra}"
        if self._bar is not None:
            self._bar.console.print(line)
        else:
            self.console.print(line)

    def scenario_started(self, name: str, total: int) -> None:
        self._last_pct = -1
        if self.console.is_terminal:
            self._bar = Progress(
                TextColumn(f"  scenario [bold]{name}[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("responses"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(name, total=total or None)

    def request_done(self, name: str, done: int, total: int) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done)
            return
        if total:
            pct = done * 100 // total
            if pct // 10 != self._last_pct // 10:
                self._last_pct = pct
                self.console.print(f"          scenario {name}: {done}/{total} responses ({pct}%)")

    def scenario_finished(self, name: str) -> None:
        self.stop()


def _fmt_threshold(check: CheckDoc) -> str:
    """In the check's own unit: a ratio for latency, seconds for startup, a rate for errors."""
    thr = check.threshold
    if thr is None:
        return ""
    if check.group == "latency":
        return f"{thr:.3f}x"
    if check.group == "startup":
        return f"{thr:.1f} s"
    if check.group == "errors":
        return f"{thr:.2%}"
    return f"{thr:.3f}"


def _fmt_interval(check: CheckDoc) -> str:
    iv = check.interval
    if not iv or iv[0] is None:
        return ""
    return f"{iv[0]:.3f}-" + ("inf" if iv[1] is None else f"{iv[1]:.3f}")


def _fmt_ratio(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}x"


def _stderr_console() -> Console:
    """A terminal's own width; 120 columns in logs and CI, where rich would assume 80 and
    truncate check ids."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(stderr=True, highlight=False, soft_wrap=True, width=120)
    return console


def print_summary(doc: VerdictDocument, console: Console | None = None) -> None:
    console = console or _stderr_console()
    if doc.checks:
        table = Table(title="checks", title_justify="left", show_lines=False)
        for col in ("check", "decision", "ratio", "interval", "threshold", "samples"):
            table.add_column(col, justify="right" if col not in ("check", "decision") else "left")
        for c in doc.checks:
            table.add_row(
                c.id,
                f"[{DECISION_STYLE.get(c.decision, 'white')}]{c.decision}[/]"
                + (" [yellow]warning[/]" if c.warning else "")
                + (" [magenta]advisory[/]" if c.advisory else ""),
                _fmt_ratio(c.ratio),
                _fmt_interval(c),
                _fmt_threshold(c),
                f"{c.samples[0]}/{c.samples[1]}",
            )
        console.print(table)
    for note in doc.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")
    summary = summary_of(doc)
    color = "green" if doc.verdict == "continue" else "red"
    console.print(
        f"\n[bold {color}]{escape(summary.banner)}[/bold {color}]  gate {doc.gate_id or ''}"
    )
    for r in doc.reasons:
        console.print(f"  [{color}]-[/{color}] {escape(r.check)}: {escape(r.message)}")
    for r in summary.warnings:
        console.print(f"  [yellow]warning  [/yellow] {escape(r.check)}: {escape(r.message)}")
    for r in summary.advisory:
        console.print(f"  [magenta]advisory [/magenta] {escape(r.check)}: {escape(r.message)}")
    if doc.verdict == "continue":  # a hold's reasons say what matters
        for r in summary.not_shown:
            console.print(f"  [yellow]not shown[/yellow] {escape(r.message)}")
    for who, lines, log in engine_tails(doc):
        shown = f"last {len(lines)} lines" if len(lines) > 1 else "last line"
        where = f" (all of it: {log})" if log else ""
        console.print(f"[dim]{escape(who)} engine's {shown}{escape(where)}:[/dim]")
        for line in lines:
            console.print(f"  [dim]|[/dim] {escape(line)}")
    if doc.report:
        console.print(f"report: {doc.report}")


def engine_tails(doc: VerdictDocument) -> list[tuple[str, list[str], str | None]]:
    """(who, its last lines, its log file) of each engine, or worker group, that ended a held
    gate: one that crashed, or one the gate's error names that never became ready."""
    if doc.verdict != "hold" or not doc.engines:
        return []
    error = doc.error.message if doc.error is not None else ""
    out = []
    for role, engine in doc.engines.items():
        if engine.groups:
            for group in engine.groups:
                if group.crashed and group.log_tail:
                    out.append((f"{role} {group.role}", _bounded(group.log_tail), group.log))
            if any(g.crashed and g.log_tail for g in engine.groups):
                continue
        if engine.crash is not None:
            tail = engine.crash.log_tail or engine.log_tail
        elif f"{role} engine" in error and "ready" not in engine.phases:
            tail = engine.log_tail
        else:
            continue
        if tail:
            out.append((role, _bounded(tail), engine.log))
    return out


def _bounded(lines: list[str]) -> list[str]:
    kept = [_ESCAPES.sub("", line).rstrip() for line in lines]
    kept = [line for line in kept if line.strip()][-TAIL_LINES:]
    return [line if len(line) <= TAIL_CHARS else line[: TAIL_CHARS - 3] + "..." for line in kept]


def _shape_words(doc: dict[str, Any]) -> str:
    shape = doc["shape"]
    sku = f", {shape['sku']}" if shape.get("sku") else ""
    if "groups" in shape:
        parts = [
            f"{g['role']} {g['gpus']} GPUs"
            + (f" on {g['nodes']} nodes" if g["nodes"] > 1 else "")
            + f" in one {g['level']}"
            + (f" ({g['sku']})" if g.get("sku") and g["sku"] != shape.get("sku") else "")
            for g in shape["groups"]
        ]
        rules = [f"{' + '.join(c['groups'])} in one {c['level']}" for c in shape["connect"]]
        return (
            (f"{shape['sku']}: " if shape.get("sku") else "")
            + "; ".join(parts)
            + (f"; connect {', '.join(rules)}" if rules else "")
            + f"; both engines in one {doc['level']}"
        )
    return (
        f"{shape['gpus_per_engine']} GPUs per engine"
        + (f" on {shape['nodes_per_engine']} nodes" if shape["nodes_per_engine"] > 1 else "")
        + sku
        + f", engines in one {shape['engine_level']}, both in one {doc['level']}"
    )


def print_capacity(doc: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(highlight=False, soft_wrap=True)
    desc = _shape_words(doc)
    console.print(
        f"[bold]{doc['inventory']}[/bold]: {doc['nodes']} nodes, {doc['gpus']} GPUs; shape: {desc}"
    )
    table = Table(title_justify="left")
    for col in ("domain", "nodes", "free GPUs", "engines", "gates"):
        table.add_column(col, justify="left" if col == "domain" else "right")
    rows = doc["per_domain"]
    for f in rows[:40]:
        table.add_row(
            f["domain"], str(f["nodes"]), str(f["free_gpus"]), str(f["engines"]), str(f["gates"])
        )
    if len(rows) > 40:
        table.add_row(f"... {len(rows) - 40} more domains", "", "", "", "")
    console.print(table)
    if doc.get("groups"):
        # Each group alone, in placement order: the first is the most constrained.
        alone = Table(title="each group alone (placement order)", title_justify="left")
        for col in ("group", "eligible nodes", "free GPUs", "domains", "fit alone"):
            alone.add_column(col, justify="left" if col == "group" else "right")
        for g in doc["groups"]:
            alone.add_row(
                g["role"],
                str(g["eligible_nodes"]),
                str(g["free_gpus"]),
                str(g["domains"]),
                str(g["instances"]),
            )
        console.print(alone)
    color = "green" if doc["gates"] else "red"
    whole = " whole" if doc.get("groups") else ""
    console.print(
        f"[bold {color}]{doc['gates']}{whole} gate shape(s) fit now[/bold {color}] "
        f"({doc['engines']} engines, {doc['free_gpus']} free GPUs on {doc['eligible_nodes']} "
        f"eligible nodes; computed in {doc['elapsed_ms']:.1f} ms)"
    )
    b = doc.get("blocked")
    if b:
        wait = "waiting can help" if b["retryable"] else "waiting will not help"
        console.print(f"[red]blocked ({b['code']})[/red]: {b['message']}; {wait}")
        removed = ", ".join(f"{k} {v}" for k, v in b["eliminated"].items() if v)
        if removed:
            console.print(f"[dim]nodes eliminated per stage: {removed}[/dim]")
