"""`gate calibrate --engines [sim|vllm]`: whole gates against real engine processes (the sim, or
real vLLM from the test bed of bench/vllm/setup).

The simulation (analysis/calibration.py) draws latencies from a model; these gates are the real
thing end to end: the gate launches two sim engine processes, mirrors Poisson load to them over
HTTP, looks and stops early as it would in production, runs the correctness suite (the default
stage, or the numerical cases' own), and judges. Each case differs from the reference only by
the candidate's sim flags, and every gate uses new engine seeds. The Kayenta-style baseline
(analysis/baseline.py) is judged on the same gate's stored samples (TTFT, mean ITL per request
and the error rate per block of 100 requests, every `BASELINE_EVERY` requests per arm on
everything so far), so both judges see exactly the same data; the baseline has no divergence
metric here (the correctness suite's probes are not stored), which the output says.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from sqlalchemy import select

from gate.analysis.baseline import judge_baseline
from gate.analysis.policy import Policy
from gate.analysis.samples import Columns, select_requests
from gate.core.database import make_engine, make_sessionmaker, transaction
from gate.core.settings import Settings
from gate.models import SampleSet
from gate.runs.runner import run_gate
from gate.spec import parse_spec
from gate.verdict.document import CapacityDoc

SIM = [sys.executable, "-m", "simengine", "--port", "{port}", "--model", "{model}"]
BASE_FLAGS = ("--ttft-ms", "40", "--itl-ms", "12")
# 40/s: the steady scenario lasts about 20 s, 10 time blocks of 2 s; judge v3 refuses a
# scenario of fewer than 8 (analysis/paired.py MIN_BLOCKS), which 808 requests at 80/s were.
RATE = 40.0
REQUESTS = 808  # 800 judged per arm after the default warm-up of 8
BASELINE_EVERY = 200
BLOCK = 100
# Issue 28's regressions that are not a steady shift, placed in the steady scenario at the
# default RATE: it lasts REQUESTS / RATE seconds (20.2 s), and its first request reaches the
# engines about LEAD_IN_S after their first generation request (the warm-up's 4 requests and
# capability discovery, measured from the sim's --truth-log; mostly the sim's own latencies,
# so about the same on any machine).
SCENARIO_S = REQUESTS / RATE
LEAD_IN_S = 1.4
# A 5 s stall a third into the scenario (--stalls count from the first generation request).
STALL_AT_S = LEAD_IN_S + SCENARIO_S / 3
STALL_S = 5.0
# TTFT +40% by the scenario's end: PCT per minute over its duration (--degrade-ttft-per-min
# counts from ready, so the scenario starts a little above +0%: about +6% after the lead-in).
TTFT_CREEP_PCT = 40.0
TTFT_CREEP_PER_MIN = TTFT_CREEP_PCT / (SCENARIO_S / 60.0)


# The capacity cases (issue 33): both sims serve 20 sequences of 25 ms decode steps, so a
# request of 16 tokens holds a slot about 0.42 s and slots bound the rate near 47/s; the
# candidate's --capacity-loss 15 keeps 17 slots (near 40/s) and changes nothing below that.
# The steady scenario runs at 12/s, about 5 of either engine's slots busy, so only the
# capacity scenario can tell them apart: by Erlang's C formula 0.002% of the candidate's
# requests then find its 17 slots full. At 20/s (until session 21) 0.6-1.0% did, against
# 0.05-0.09% of the reference's, and the steady tail check held on that once in ten gates:
# a real queue, not the low-load latency the contract keeps equal. The search brackets each
# engine to 3% from 20/s in steps of 1.5x, 4 s per step. With 2 s steps an engine overloaded
# by up to about 10% still kept its 250 ms TTFT in one step (a queue grows by the overload x
# the step's length), and held the loss less often (docs/calibration.md, "Capacity").
CAPACITY_FLAGS = ("--max-num-seqs", "20", "--itl-ms", "25")
CAPACITY_RATE = 12.0
CAPACITY_REQUESTS = 296  # 25 s at 12/s: 9 time blocks of 32 requests (analysis/paired.py)
CAPACITY_SCENARIO: dict[str, Any] = {
    "suite": "capacity",
    "name": "capacity",
    "slo": {"ttft_ms": 250},
    "goodput": 0.95,
    "start_rate": 20,
    "max_rate": 100,
    "growth": 1.5,
    "resolution": 0.03,
    "step_s": 4,
    "repeats": 1,
    "prompt_tokens": 32,
    "max_tokens": 16,
}
# Issue 32's GPU regressions, read through the sim's stand-in nvidia-smi (simengine/
# nvidia_smi.py, on PATH for the sim gates, over each gate's own state directory). Energy per
# token is idle power over the token rate plus the joules each token adds: at RATE requests/s
# of up to 32 tokens (about 1,000 tokens/s here) the sim's 90 W of idle is about 0.09 J a
# token beside its 0.5 J, so 0.67 J a token is about +30% of energy per token.
GPU_MEMORY_GIB = 26.0  # against the sim's 20: x1.3
GPU_J_PER_TOKEN = 0.67  # against the sim's 0.5: energy per token about x1.3

EngineKind = Literal["sim", "vllm"]

# Real vLLM (`--engines vllm`): vLLM's CPU build from the test bed of bench/vllm/setup (`make
# vllm`), in $GATE_VLLM_HOME (default .vllm). Two servers and the gate share two cores here, and
# eager vLLM spends about 20 ms of CPU per generated token of this tiny model at light load (its
# scheduler, worker and API server in Python; measured over 20 s of 4/s: 1.2 cores for 64
# tokens/s with OMP_WAIT_POLICY=PASSIVE, 2.0 without, OpenMP's threads spinning between steps).
# 4/s of 32-token answers kept both cores busy and both engines queueing (TTFT 3 s -> 25 s); the
# load is 2/s of 16-token answers, about 0.3 of a core per engine, while one sequence slot is
# busy about 70% of the time (16 steps of about 20 ms a request), so the one-slot candidate
# queues; at 3/s of 8 tokens it was busy about 40% and its TTFT p90 of 1.7x stayed undecided
# on a busy host. 280 requests (272 judged) make 8 time blocks of 16 s, the least the paired
# checks decide on. Eager: compiling on CPU stalls an engine for seconds in its first minute of
# load (examples/specs/vllm-cpu.yaml).
VLLM_RATE = 2.0
VLLM_REQUESTS = 280
VLLM_MAX_TOKENS = 16
VLLM_ARGS = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager")
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # two cores: no core to reserve per engine
    "OMP_WAIT_POLICY": "PASSIVE",  # idle OpenMP threads sleep instead of spinning
}
VLLM_SLOTS = ("--max-num-seqs", "8")


def vllm_home() -> Path:
    import os

    return Path(os.environ.get("GATE_VLLM_HOME", ".vllm")).resolve()


def vllm_engine(
    home: Path, *args: str, weights: str = "tiny-a", env: dict[str, str] | None = None
) -> dict[str, Any]:
    """A vllm preset engine of the test bed in `home`: its venv's python, `weights` (a model
    bench/vllm/make_models.py made), the CPU flags and `args` after them (the last wins)."""
    return {
        "preset": "vllm",
        "python": str(home / "venv" / "bin" / "python"),
        "args": [*VLLM_ARGS, "--model", str(home / "models" / weights), *args],
        "env": {**VLLM_ENV, **(env or {})},
        "readiness_timeout_s": 600,
    }


@dataclass(frozen=True)
class EngineCase:
    """What the candidate sim does differently (flags), and whether the gate runs the
    correctness suite (the numerical cases). For vLLM the flags are the server's and
    `weights` the candidate's model."""

    name: str
    candidate: tuple[str, ...] = ()
    reference: tuple[str, ...] = ()
    correctness: bool = False
    # The spec's `correctness`: "auto" gives every other case the default correctness stage,
    # as a user's gate has; "off" leaves only the load scenario's mirrored outputs to judge.
    stage: Literal["auto", "off"] = "auto"
    weights: str = "tiny-a"
    capacity: bool = False  # the steady scenario at CAPACITY_RATE, then CAPACITY_SCENARIO


ENGINE_CASES: tuple[EngineCase, ...] = (
    EngineCase("A/A"),
    EngineCase("TTFT x1.20", ("--ttft-ms", "48")),
    EngineCase("ITL x1.10", ("--itl-ms", "13.2")),
    EngineCase("errors x5", ("--error-rate", "0.05"), ("--error-rate", "0.01")),
    EngineCase("benign logit noise", ("--logit-noise", "0.03"), correctness=True),
    EngineCase("numerical bug", ("--numeric-bug", "0.05"), correctness=True),
    EngineCase("candidate crash", ("--crash-after-s", "6")),
    # Issue 18's numerics against a deterministic reference (the sim is bit-identical against
    # itself), each through the default correctness stage.
    EngineCase("fp16-class noise 0.002", ("--logit-noise", "0.002")),
    EngineCase("fp16-class noise 0.01", ("--logit-noise", "0.01")),
    EngineCase("noise 0.3 nat", ("--logit-noise", "0.3")),
    EngineCase("wrong tokens (30% of positions)", ("--numeric-bug", "0.3")),
    EngineCase("load only: wrong tokens", ("--numeric-bug", "0.3"), stage="off"),
    # Issue 28: no steady shift. 3% of requests with 4x their TTFT (the median does not move);
    # the engine serving nothing for 5 s; TTFT creeping from +0% to about +40%. No "timeouts"
    # case: a request only times out after the client's 60 s without progress (loadgen
    # Target.timeout_s, which the spec does not set) and the scenario waits for every request,
    # so each such gate would take a minute longer than the ~30 s of the others.
    EngineCase("tail share 3% x4", ("--slow-share", "0.03", "--slow-factor", "4")),
    EngineCase("stall 5 s", ("--stalls", f"{STALL_AT_S:.1f}:{STALL_S:g}")),
    EngineCase("TTFT creep", ("--degrade-ttft-per-min", f"{TTFT_CREEP_PER_MIN:.1f}")),
    # Issue 32: an image that allocates fewer KV blocks. At 40/s about 17 requests of 160
    # tokens are in flight (2,700 tokens): 4096 blocks of 16 never run out, 128 (2,048
    # tokens) do at the load's busier moments, and the sim's scheduler preempts
    # (vllm:num_preemptions_total); both state their cache in vllm:cache_config_info.
    EngineCase(
        "fewer KV blocks (preempts)",
        ("--max-model-len", "1024", "--num-gpu-blocks-override", "128"),
        ("--max-model-len", "1024", "--num-gpu-blocks-override", "4096"),
    ),
    # Issue 33: the capacity scenario on A/A, and on a candidate that sustains 15% less.
    EngineCase("A/A capacity", CAPACITY_FLAGS, CAPACITY_FLAGS, stage="off", capacity=True),
    EngineCase(
        "capacity -15%",
        (*CAPACITY_FLAGS, "--capacity-loss", "15"),
        CAPACITY_FLAGS,
        stage="off",
        capacity=True,
    ),
    # Issue 32: the engine's GPUs (gate/analysis/gpu.py), through the stand-in nvidia-smi.
    EngineCase("GPU memory x1.3", ("--gpu-memory-gib", f"{GPU_MEMORY_GIB:g}")),
    EngineCase("energy per token x1.3", ("--gpu-j-per-token", f"{GPU_J_PER_TOKEN:g}")),
)


VLLM_CASES: tuple[EngineCase, ...] = (
    EngineCase("A/A"),
    # one sequence at a time against eight: requests queue behind each other
    EngineCase("one slot (--max-num-seqs 1)", ("--max-num-seqs", "1")),
    # a KV cache of 3 usable blocks of 32 tokens (96; vLLM keeps one of the 4 for itself) for
    # requests of 48 (2 blocks each): a second request in flight takes the third block for its
    # prompt, and one of the two is preempted when it needs one more
    # (vllm:num_preemptions_total counts them). vLLM refuses to start when its context does not
    # fit its KV cache ("the estimated maximum model length is 64" with 3 blocks), so the
    # context is 96 too (the correctness probes: 32 + 32 tokens).
    EngineCase(
        "KV cache of 96 tokens (preempts)",
        ("--block-size", "32", "--num-gpu-blocks-override", "4", "--max-model-len", "96"),
    ),
    EngineCase("other weights", weights="tiny-b"),
    EngineCase("bfloat16 against float32", ("--dtype", "bfloat16")),
    # Issue 33 on real vLLM: the capacity search between eight slots and eight, and against
    # one slot (VLLM_CAPACITY_SCENARIO).
    EngineCase("A/A capacity", stage="off", capacity=True),
    EngineCase("one slot capacity", ("--max-num-seqs", "1"), stage="off", capacity=True),
)

# The capacity search on real vLLM (measured here, docs/calibration.md "Capacity on real
# vLLM"): eight slots of this tiny model kept a 1 s TTFT for 95% of a step at 32/s, the
# highest rate tried by hand, so the search goes to 64/s to bracket them; one slot kept it to
# about 8/s. The sim's search otherwise, from 2/s doubling, to 10%, no repeats (every step is
# two vLLM servers and the gate on two cores). The steady scenario beside it (the spec needs
# one: latency is compared only there) is 40 requests at 2/s, its latency left undecided.
VLLM_CAPACITY_SCENARIO: dict[str, Any] = {
    **CAPACITY_SCENARIO,
    "slo": {"ttft_ms": 1000},
    "start_rate": 2,
    "max_rate": 64,
    "growth": 2,
    "resolution": 0.1,
    "repeats": 0,
}
VLLM_CAPACITY_STEADY = 40


@dataclass(frozen=True)
class EngineGate:
    held: bool
    requests: int | None  # requests per arm judged when ours held
    reasons: tuple[str, ...]
    baseline_held: bool
    baseline_requests: int | None
    wall_s: float = 0.0  # the whole gate, launch to teardown
    warnings: tuple[str, ...] = ()  # checks in the warning tier (a continue's "with N warnings")
    capacity: tuple[str, tuple[float, float]] | None = (
        None  # the capacity check: decision, interval
    )
    # the capacity search's steps as the host's CPUs saw them: (rate, busy share, stall share,
    # whether the step bounds a knee), in the order they ran
    cpu_steps: tuple[tuple[float, float | None, float | None, bool], ...] = ()

    def knee_cpu(self, pick: int) -> float | None:
        """The most busy (pick 1) or stalled (pick 2) share among steps that bound a knee."""
        seen = [s[pick] for s in self.cpu_steps if s[3] and s[pick] is not None]
        return max(seen) if seen else None  # type: ignore[type-var]


@dataclass(frozen=True)
class EngineCaseResult:
    name: str
    gates: tuple[EngineGate, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        runs = len(self.gates)
        held = [g.requests for g in self.gates if g.held and g.requests is not None]
        b_held = [g.baseline_requests for g in self.gates if g.baseline_held]
        reasons = Counter(r for g in self.gates for r in g.reasons)
        return {
            "name": self.name,
            "runs": runs,
            "hold_rate": sum(g.held for g in self.gates) / runs if runs else None,
            "median_requests_to_hold": statistics.median(held) if held else None,
            "reasons": dict(sorted(reasons.items())),
            "baseline_hold_rate": sum(g.baseline_held for g in self.gates) / runs if runs else None,
            "wall_s": [round(g.wall_s, 1) for g in self.gates],
            "warnings": dict(sorted(Counter(w for g in self.gates for w in g.warnings).items())),
            "capacity": [
                {
                    "decision": g.capacity[0],
                    "ratio_interval": [round(x, 4) for x in g.capacity[1]],
                    "knee_host_cpu": g.knee_cpu(1),
                    "knee_cpu_stall": g.knee_cpu(2),
                    "steps": [list(step) for step in g.cpu_steps],
                }
                for g in self.gates
                if g.capacity is not None
            ],
            "baseline_median_requests_to_hold": statistics.median(
                [r for r in b_held if r is not None]
            )
            if any(r is not None for r in b_held)
            else None,
        }


def vllm_spec_for(case: EngineCase, k: int, seed: int, rate: float = VLLM_RATE) -> dict[str, Any]:
    """The gate spec of gate `k` of a real-vLLM case (the weights are seeded: nothing to vary
    between gates but the load's seed)."""
    home = vllm_home()
    return {
        "name": "calibrate-vllm-" + "".join(ch if ch.isalnum() else "-" for ch in case.name),
        "model": "tiny",
        "seed": seed * 1_000 + k,
        "reference": vllm_engine(home, *VLLM_SLOTS, *case.reference),
        "candidate": vllm_engine(home, *VLLM_SLOTS, *case.candidate, weights=case.weights),
        "scenarios": [
            {
                "name": "steady",
                "arrival": "poisson",
                "rate": rate,
                "requests": VLLM_CAPACITY_STEADY if case.capacity else VLLM_REQUESTS,
                "prompt_tokens": 32,
                "max_tokens": VLLM_MAX_TOKENS,
            },
            *([dict(VLLM_CAPACITY_SCENARIO)] if case.capacity else []),
        ],
        "correctness": case.stage,
        **({"policy": {"short_scenarios": "allow"}} if case.capacity else {}),
    }


def spec_for(
    case: EngineCase, k: int, seed: int, rate: float = RATE, kind: EngineKind = "sim"
) -> dict[str, Any]:
    """The gate spec of gate `k` of a case: fresh engine seeds per gate."""
    if kind == "vllm":
        return vllm_spec_for(case, k, seed, rate)
    ref_seed, cand_seed = 2 * (seed * 1_000 + k) + 1, 2 * (seed * 1_000 + k) + 2
    scenarios: list[dict[str, Any]] = [
        {
            "name": "steady",
            "api": "completions",
            "arrival": "poisson",
            "rate": CAPACITY_RATE if case.capacity else rate,
            "requests": CAPACITY_REQUESTS if case.capacity else REQUESTS,
            "prompt_tokens": 32 if case.capacity else 128,
            "max_tokens": 16 if case.capacity else 32,
        }
    ]
    if case.capacity:
        scenarios.append(dict(CAPACITY_SCENARIO))
    if case.correctness:
        scenarios.append({"suite": "correctness", "probes_count": 8, "max_tokens": 24})
    return {
        "name": "calibrate-" + "".join(ch if ch.isalnum() else "-" for ch in case.name),
        "model": "calibration-model",
        "seed": seed * 1_000 + k,
        "reference": {
            "command": [*SIM, *BASE_FLAGS, *case.reference, "--seed", str(ref_seed)],
        },
        "candidate": {
            "command": [*SIM, *BASE_FLAGS, *case.candidate, "--seed", str(cand_seed)],
        },
        "shape": {"sku": "H200", "gpus_per_engine": 1},
        "scenarios": scenarios,
        "correctness": case.stage,
    }


def _arrays(cols: Columns, warmup: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    c = select_requests(cols, warmup)
    ok = c.ok & (c.first_token_ns >= 0)
    ttft = np.where(ok, (c.first_token_ns - c.sent_ns) / 1e6, np.nan)
    itl = np.where(ok, c.itl_mean_ns / 1e6, np.nan)
    return ttft, itl, (~c.ok).astype(np.float64)


def baseline_on_samples(
    reference: Columns, candidate: Columns, warmup: int
) -> tuple[bool, int | None]:
    """Kayenta's scoring on a gate's stored samples, every BASELINE_EVERY requests per arm."""
    r_ttft, r_itl, r_err = _arrays(reference, warmup)
    c_ttft, c_itl, c_err = _arrays(candidate, warmup)
    n = min(r_ttft.size, c_ttft.size)
    if n == 0:
        return False, None
    looks = list(range(BASELINE_EVERY, n + 1, BASELINE_EVERY))
    if not looks or looks[-1] != n:
        looks.append(n)

    def finite(x: np.ndarray) -> np.ndarray:
        return np.asarray(x[np.isfinite(x)], dtype=np.float64)

    def blocks(err: np.ndarray) -> np.ndarray:
        m = err.size // BLOCK
        if not m:
            return err[:1]
        return np.asarray(err[: m * BLOCK].reshape(m, BLOCK).mean(axis=1), dtype=np.float64)

    intervals = [
        {
            "ttft": (finite(c_ttft[:t]), finite(r_ttft[:t])),
            "itl": (finite(c_itl[:t]), finite(r_itl[:t])),
            "errors": (blocks(c_err[:t]), blocks(r_err[:t])),
        }
        for t in looks
    ]
    result = judge_baseline(intervals)
    if not result.held or result.look is None:
        return False, None
    return True, looks[result.look]


def _stored(db_url: str, gate_id: str, scenario: str) -> dict[str, Columns]:
    factory = make_sessionmaker(make_engine(db_url))
    with transaction(factory) as s:
        rows = s.scalars(
            select(SampleSet).where(SampleSet.gate_id == gate_id, SampleSet.scenario == scenario)
        ).all()
        return {row.role: Columns.from_bytes(row.columns) for row in rows}


# The sim's simulated GPUs (simengine/gpu.py) write their state where this names, and its
# stand-in nvidia-smi (simengine/nvidia_smi.py) reads it; both run as processes only.
GPU_STATE_DIR_ENV = "SIMENGINE_GPU_STATE_DIR"


@contextlib.contextmanager
def sim_gpus(work: Path) -> Iterator[None]:
    """The sim engines' GPUs readable as a real GPU's through nvidia-smi: the stand-in on PATH
    and a state directory for this gate's sims (simengine/gpu.py), for the gate's duration."""
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m simengine.nvidia_smi "$@"\n')
    smi.chmod(0o755)
    saved = {k: os.environ.get(k) for k in ("PATH", GPU_STATE_DIR_ENV)}
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{saved['PATH'] or ''}"
    os.environ[GPU_STATE_DIR_ENV] = str(work / "gpus")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_engine_gate(
    case: EngineCase, k: int, seed: int, work: Path, rate: float = RATE, kind: EngineKind = "sim"
) -> EngineGate:
    spec = parse_spec(spec_for(case, k, seed, rate, kind), f"calibration case {case.name!r}")
    db_url = f"sqlite:///{work / 'calibration.db'}"
    started = time.monotonic()
    # The sims' GPUs through the stand-in (a real GPU's, with vLLM, through whatever the
    # machine has: NVML, nvidia-smi, or nothing and a note).
    gpus = sim_gpus(work) if kind == "sim" else contextlib.nullcontext()
    settings = Settings(
        data_dir=work / ".gate", gpu_telemetry="nvidia-smi" if kind == "sim" else "auto"
    )
    with gpus:
        out = asyncio.run(run_gate(spec, settings, report_dir=None, db_url=db_url))
    wall_s = time.monotonic() - started
    doc = out.document
    held = doc["verdict"] == "hold"
    reasons = tuple(r["check"] for r in doc.get("reasons") or [])
    steady: dict[str, Any] = next(
        (s for s in doc.get("scenarios") or [] if s.get("name") == "steady"), {}
    )
    by_id = {c["id"]: c for c in doc.get("checks") or []}
    samples = (by_id.get("steady.errors") or {}).get("samples") or []
    requests = min(samples) if samples else None
    early = steady.get("early_stop") or {}
    if early.get("requests") is not None:
        requests = int(early["requests"])
    cols = _stored(db_url, str(doc["gate_id"]), "steady")
    b_held, b_requests = False, None
    if set(cols) == {"reference", "candidate"}:
        b_held, b_requests = baseline_on_samples(
            cols["reference"], cols["candidate"], Policy().warmup_requests
        )
    warnings = tuple(w["check"] for w in doc.get("warnings") or [])
    cap = by_id.get("capacity.capacity")
    capacity = (cap["decision"], tuple(cap["interval"])) if cap and cap["interval"] else None
    return EngineGate(
        held,
        requests if held else None,
        reasons,
        b_held,
        b_requests,
        wall_s,
        warnings,
        capacity,
        _cpu_steps(doc),
    )


def _cpu_steps(doc: dict[str, Any]) -> tuple[tuple[float, float | None, float | None, bool], ...]:
    """The first capacity search's steps as EngineGate.cpu_steps keeps them."""
    if not doc.get("capacity"):
        return ()
    cap = CapacityDoc.model_validate(doc["capacity"][0])
    edges = cap.search().knee_rates()
    return tuple((s.rate, s.host_cpu, s.cpu_stall, s.rate in edges) for s in cap.steps)


def calibrate_engines(
    runs: int,
    seed: int = 0,
    cases: Sequence[EngineCase] = ENGINE_CASES,
    progress: Callable[[str], None] | None = None,
    rate: float = RATE,
    kind: EngineKind = "sim",
) -> list[EngineCaseResult]:
    """`runs` real gates per case at `rate` requests per second, against sim engines or real
    vLLM (`kind`); each gate in a fresh working directory, torn down after."""
    results = []
    for case in cases:
        gates = []
        for k in range(runs):
            with tempfile.TemporaryDirectory(prefix="gate-calibrate-") as tmp:
                gate = run_engine_gate(case, k, seed, Path(tmp), rate, kind)
            gates.append(gate)
            if progress is not None:
                verdict = "hold" if gate.held else "continue"
                why = f" ({', '.join(gate.reasons[:3])})" if gate.reasons else ""
                at = f" at {gate.requests} requests per arm" if gate.requests else ""
                cap = ""
                if gate.capacity is not None:
                    lo, hi = gate.capacity[1]
                    busy, stall = gate.knee_cpu(1), gate.knee_cpu(2)
                    cpu = f", host CPUs {busy:.0%} busy at the knees" if busy is not None else ""
                    cpu += f", {stall:.0%} stalled" if stall is not None else ""
                    cap = f"; capacity {gate.capacity[0]} [{lo:.3f}, {hi:.3f}]{cpu}"
                progress(
                    f"engines: {case.name} gate {k + 1}/{runs}: {verdict}{at}{why} "
                    f"in {gate.wall_s:.0f} s{cap}"
                )
        results.append(EngineCaseResult(case.name, tuple(gates)))
    return results
