"""A scenario's workload built into its schedule: its files found under the operator's
directory and read within the caps, its parts drawn over the scenario's arrivals (or a
trace's own instants), and the workload described for the verdict (docs/workloads.md).

Where files come from is the operator's, never a caller's (docs/security.md): with
`GATE_WORKLOAD_DIR` set, a part's `file` is a path relative to it, resolved with every link
followed and refused unless it stays inside; unset, the API refuses every workload file
(`confined`), and `gate run`, the operator's own command, reads it relative to its working
directory. A file's mistakes are spec mistakes (`WorkloadError`, a `SpecError`), named by the
scenario's field, the file as the spec wrote it, the line and the record's field, and the
CLI and the API refuse the spec with them before any gate is queued (`plan_problems`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gate.core.errors import FieldProblem, WorkloadError
from gate.core.limits import Limits
from gate.spec import ScenarioSpec
from gate.spec.workloads import WorkloadPart
from gate.verdict.document import LengthsDoc, WorkloadDoc, WorkloadPartDoc
from loadgen.schedule import build_offsets
from loadgen.traffic import Part, Traffic, build_mix, replay_trace
from loadgen.workload_files import (
    FileCaps,
    WorkloadFileError,
    read_request_log,
    read_sharegpt,
    read_trace,
)

if TYPE_CHECKING:
    from gate.core.settings import Settings

NO_DIRECTORY = (
    "the operator has set no workload directory (GATE_WORKLOAD_DIR), so the service reads "
    "no workload file"
)


@dataclass(frozen=True, slots=True)
class WorkloadFiles:
    """Where a spec's workload files are read from (module docstring). The runner confines
    the gates a service's worker runs (`GateRunner.worker`), as the API confined their specs."""

    root: Path | None = None
    confined: bool = False

    @classmethod
    def of(cls, settings: Settings, *, confined: bool) -> WorkloadFiles:
        return cls(settings.workload_dir, confined)

    def resolve(self, name: str, at: str) -> Path:
        if self.root is None:
            if self.confined:
                raise WorkloadError([FieldProblem(at, NO_DIRECTORY)])
            return Path(name)
        root = self.root.resolve()
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            raise WorkloadError(
                [FieldProblem(at, f"{name} leads outside the operator's workload directory")]
            )
        return path


def file_caps(limits: Limits) -> FileCaps:
    return FileCaps(
        max_bytes=limits.max_workload_file_bytes,
        max_lines=limits.max_workload_records,
        max_prompt_tokens=limits.max_prompt_tokens,
        max_output_tokens=limits.max_output_tokens,
        max_span_s=limits.max_scenario_duration_s,
    )


def build_workload(
    sc: ScenarioSpec, at: str, seed: int, limits: Limits, files: WorkloadFiles
) -> Traffic:
    """The scenario's traffic; every mistake a `WorkloadError` naming `at`'s field."""
    assert sc.workload is not None
    extra = {"ignore_eos": sc.ignore_eos, "temperature": sc.temperature}
    caps = file_caps(limits)
    try:
        trace = sc.workload.trace
        if trace is not None:
            assert trace.file is not None
            path = files.resolve(trace.file, f"{at}.workload.file")
            rows = read_trace(path, trace.file, caps, block_tokens=trace.block_tokens)
            traffic = replay_trace(
                rows,
                rate=sc.rate,
                requests=sc.requests,
                duration_s=sc.duration_s,
                block_tokens=trace.block_tokens,
                seed=seed,
                extra=extra,
            )
        else:
            mix = sc.workload.mix
            parts = [
                _part(sc, p, f"{at}.workload" + (f".mix[{i}]" if len(mix) > 1 else ""), caps, files)
                for i, p in enumerate(mix)
            ]
            assert sc.rate is not None and sc.arrival != "concurrency"
            units = build_offsets(**sc.open_loop(), seed=seed)
            traffic = build_mix(parts, units, seed=seed, extra=extra)
    except WorkloadFileError as exc:
        raise WorkloadError([FieldProblem(f"{at}.workload.file", str(exc))]) from None
    except ValueError as exc:
        field, _, why = str(exc).partition(": ")
        raise WorkloadError([FieldProblem(f"{at}.{field}", why or str(exc))]) from None
    return _within_caps(traffic, at, limits)


def _part(sc: ScenarioSpec, p: WorkloadPart, at: str, caps: FileCaps, files: WorkloadFiles) -> Part:
    prompt = p.prompt_tokens or sc.prompt_tokens
    part = Part(
        kind=p.kind,
        share=p.share,
        prompt_tokens=prompt,
        max_tokens=p.max_tokens or sc.max_tokens,
        turns=p.turns or (1 if p.kind == "sessions" else 0),
        think_s=p.think_s,
        groups=p.groups,
        prefix_tokens=p.prefix_tokens or 0,
    )
    if p.file is None:
        return part
    path = files.resolve(p.file, f"{at}.file")
    try:
        if p.kind == "sharegpt":
            return replace(part, conversations=read_sharegpt(path, p.file, caps))
        return replace(part, logged=read_request_log(path, p.file, caps))
    except WorkloadFileError as exc:  # named at this part's file
        raise WorkloadError([FieldProblem(f"{at}.file", str(exc))]) from None


def _within_caps(traffic: Traffic, at: str, limits: Limits) -> Traffic:
    """The built size against the caps that arithmetic could not see (a file's records, a
    session's turns)."""
    n = len(traffic.requests)
    if n > limits.max_scenario_requests:
        raise WorkloadError(
            [
                FieldProblem(
                    at,
                    f"the workload makes {n} requests, above the cap of "
                    f"{limits.max_scenario_requests} requests per scenario "
                    "(GATE_MAX_SCENARIO_REQUESTS)",
                )
            ]
        )
    span = float(traffic.offsets_s[-1]) if n else 0.0
    if span > limits.max_scenario_duration_s:
        raise WorkloadError(
            [
                FieldProblem(
                    at,
                    f"the workload spans {span:.0f} s, above the cap of "
                    f"{limits.max_scenario_duration_s:g} s per scenario "
                    "(GATE_MAX_SCENARIO_DURATION_S)",
                )
            ]
        )
    return traffic


# --------------------------------------------------------------------------- description

_BINS = 20


def _lengths(values: list[int]) -> LengthsDoc:
    arr = np.asarray(values, dtype=np.float64)
    if not arr.size:
        return LengthsDoc(count=0)
    lo, hi = float(arr.min()), float(arr.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1, _BINS + 1)
    counts, _ = np.histogram(arr, bins=edges)
    q = np.quantile(arr, [0.5, 0.9, 0.99])
    return LengthsDoc(
        count=int(arr.size),
        mean=round(float(arr.mean()), 2),
        p50=float(q[0]),
        p90=float(q[1]),
        p99=float(q[2]),
        min=lo,
        max=hi,
        edges=[round(float(e), 2) for e in edges],
        counts=[int(c) for c in counts],
    )


def describe_workload(sc: ScenarioSpec, traffic: Traffic) -> WorkloadDoc:
    """What the scenario sent: its parts, prompt and output lengths, arrivals per second."""
    assert sc.workload is not None
    first = np.asarray(traffic.turns) == 0
    offsets = traffic.offsets_s[first] if first.size else traffic.offsets_s
    span = float(offsets[-1]) if offsets.size else 0.0
    width = max(span / 40, 0.05)
    counts: list[int] = (
        np.bincount(np.floor(offsets / width).astype(np.int64)).tolist() if offsets.size else []
    )
    parts = [
        WorkloadPartDoc(
            kind=p.kind,
            share=p.share,
            file=p.file,
            requests=sum(1 for k in traffic.kinds if k == p.kind),
        )
        for p in sc.workload.mix
    ]
    later = len(traffic.later_turns)
    return WorkloadDoc(
        parts=parts,
        requests=len(traffic.requests),
        sessions=traffic.sessions,
        later_turns=later,
        replay=("recorded" if sc.rate is None else "time-scaled")
        if sc.workload.trace is not None
        else None,
        prompt_tokens=_lengths(traffic.prompt_words()),
        output_tokens=_lengths([r.max_tokens for r in traffic.requests]),
        arrivals_bin_s=round(width, 4),
        arrivals=counts,
        notes=list(traffic.notes),
    )


def multi_turn_note(name: str, doc: WorkloadDoc) -> str:
    """What a comparison of multi-turn sessions is, and is not (the verdict's note)."""
    return (
        f"Scenario {name} sends multi-turn sessions ({doc.sessions} sessions, {doc.later_turns} "
        "later turns): each turn after the first carries the conversation so far with that "
        "engine's own earlier answers, so the two engines' contexts differ after the first "
        "turn, and each later turn leaves after that engine's own answer plus the think time, "
        "so a slower engine gets its later turns later. Latency checks pair the same turn of "
        "the same session by request id; the mirrored-output comparison covers first turns "
        "only."
    )
