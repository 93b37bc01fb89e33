"""How a gate starts its two engines (gate/runs/engine_pair.py): one after the other when both
are processes on a host with no GPU, so that each engine's startup steps are its own and not
the contention for the CPUs they share (started together on two cores, identical vLLM servers
measured one step at 3.5 s against 0.4 s); both at once when each has its GPUs. The host's GPUs
are what `nvidia-smi` lists (gate/runs/testbed.py), here none or a stand-in script printing
NVIDIA's documented `--query-gpu=... --format=csv,noheader,nounits` form.

Starting in turn does not keep other work off the host's CPUs: each process engine's launch is
measured for it (`launch_host_busy`), and a startup rule that other work could explain is not
shown rather than held (gate/analysis/engines.py)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from gaterun import SIM, run_in_tmp, tiny_spec
from sqlalchemy import select

from gate.core.database import make_engine, make_sessionmaker
from gate.models import GatePhase
from gate.runs.engine_pair import CpuMark, Engines
from gate.spec import parse_spec
from gate.telemetry.host_cpu import CpuReading, TreeUse, tree_cpu_s

pytestmark = pytest.mark.slow


def _path_without_nvidia_smi() -> str:
    return os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists()
    )


def _phases(tmp_path: Path, tag: str) -> tuple[dict[str, float], dict[str, float], list[str]]:
    doc = run_in_tmp(tiny_spec(tag, name="launch", rate=40, requests=40), tmp_path).document
    factory = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'g.db'}"))
    with factory() as s:
        rows = s.scalars(select(GatePhase).where(GatePhase.role == "gate")).all()
        gate = [f"{r.phase} {r.detail or ''}" for r in rows]
    return doc["engines"]["reference"]["phases"], doc["engines"]["candidate"]["phases"], gate


def test_engines_that_share_the_hosts_cpus_start_one_after_the_other(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _path_without_nvidia_smi())
    assert shutil.which("nvidia-smi") is None
    ref, cand, gate = _phases(tmp_path, tag)
    # the candidate was launched only once the reference answered its model list
    assert ref["model_listed"] <= cand["launched"], (ref, cand)
    assert any("one engine after the other" in p for p in gate), gate


def test_engines_on_a_host_with_gpus_start_together(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\nprintf "NVIDIA H100 80GB HBM3, 570.124.06, 81559\\n"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{_path_without_nvidia_smi()}")
    ref, cand, gate = _phases(tmp_path, tag)
    # both launched before either could answer: a Python engine process takes far longer to
    # import and bind than the gate takes to spawn the second one
    assert cand["launched"] < ref["model_listed"] and ref["launched"] < cand["model_listed"]
    assert not any("one engine after the other" in p for p in gate), gate


# Spins at the lowest priority: it keeps every CPU busy without delaying the engines much (CFS
# weights: 15 at nice 19 against 1024 at nice 0, 110 at nice 10 where CI's parallel tier runs).
_SPIN = "import os\nos.nice(19)\nwhile True:\n    pass\n"


def test_a_slow_start_is_held_on_a_host_kept_busy_by_work_that_does_not_delay_it(
    tmp_path: Path, tag: str
) -> None:
    sim = [*SIM, "--tag", tag, "--profile", "tiny"]
    spec = parse_spec(
        {
            "name": "busy-host",
            "model": "demo-model",
            "reference": {"command": sim},
            # 10 s asleep before its port opens: no wait for a CPU explains that.
            "candidate": {"command": [*sim, "--load-s", "10"]},
            "scenarios": [{"name": "steady", "rate": 20, "requests": 168, "max_tokens": 4}],
            "policy": {"short_scenarios": "allow"},
        }
    )
    n = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(n)]
    try:
        doc = run_in_tmp(spec, tmp_path).document
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    for role in ("reference", "candidate"):
        busy = doc["engines"][role]["launch_host_busy"]
        wait = doc["engines"][role]["launch_cpu_wait_s"]
        assert busy is not None and 0.5 <= busy <= 1.0, (role, busy)  # the spinners' share
        assert wait is not None and wait >= 0.0, (role, wait)
    held = {r["check"]: r["message"] for r in doc["reasons"]}
    assert doc["verdict"] == "hold", doc["reasons"]
    assert "not enough to explain it" in held["startup.phase.port_open"], held


class _Local:
    """A local engine as `Engines.cpu_mark` reads it: root pids and retired CPU seconds."""

    def __init__(self, pids: list[int], retired: float) -> None:
        self.pids, self.retired_cpu_s = pids, retired

    def own_pids(self) -> list[int]:
        return self.pids


def test_a_mark_counts_every_local_engines_trees_and_killed_attempts() -> None:
    burn = "import time\nwhile time.process_time() < 0.3:\n    pass\nprint('burnt', flush=True)\n"
    burn += "time.sleep(60)\n"
    procs = [
        subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "burnt\n"
        engines = Engines(ctx=cast(Any, None), placement=None)
        # a worker-group engine's two processes, one killed attempt of 0.5 s; the other engine
        # an attached endpoint, which has no process here
        engines.built = {
            "reference": cast(Any, _Local([procs[0].pid, procs[1].pid], 0.5)),
            "candidate": cast(Any, object()),
        }
        mark = engines.cpu_mark(host_first=True)
        assert set(mark.uses) == {"reference"}
        assert mark.own_s >= 0.5 + 2 * 0.29  # both processes' 0.3 s and the retired 0.5 s
        assert mark.uses["reference"].waits == {}  # roots are keepers: their threads left out
        # exactly the two trees (asleep now): the third burner is nobody's, not the engines'
        two = sum(tree_cpu_s(p.pid) or 0.0 for p in procs[:2])
        assert mark.uses["reference"].cpu_s == pytest.approx(two, abs=0.02)
        assert mark.own_s == pytest.approx(two + 0.5, abs=0.02)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _mark(gate_wait: float, engine_wait: float | None) -> CpuMark:
    uses = {} if engine_wait is None else {"candidate": TreeUse(1.0, {7: engine_wait})}
    return CpuMark(CpuReading(0.0), uses, 0.0, TreeUse(waits={1: gate_wait}))


def test_a_scenario_on_a_starved_host_says_so() -> None:
    engines = Engines(ctx=cast(Any, None), placement=None)
    # 0.5 s of 10 (5%) and 1.9 s (19%): nothing to say
    assert engines.contention_note("steady", _mark(0.0, 0.0), _mark(0.5, 1.9), 10.0) is None
    note = engines.contention_note("steady", _mark(1.0, 0.0), _mark(8.0, 0.1), 10.0)
    assert note is not None
    assert "scenario steady" in note and "the load generator 70%, the candidate 1%" in note
    assert "read smaller than it is" in note
    # an engine's own wait is said too, with no local engine only the load generator's
    assert "the candidate 30%" in (
        engines.contention_note("s", _mark(0.0, 0.0), _mark(0.0, 3.0), 10.0) or ""
    )
    assert engines.contention_note("s", _mark(0.0, None), _mark(0.1, None), 10.0) is None
    assert engines.contention_note("s", _mark(0.0, None), _mark(9.0, None), 0.0) is None


_STARVED = """
import json, sys
sys.path.insert(0, "tests/support")
from pathlib import Path
from gaterun import run_in_tmp, tiny_spec
doc = run_in_tmp(tiny_spec(sys.argv[1], name="starved", rate=20, requests=60), Path(sys.argv[2]))
Path(sys.argv[2], "doc.json").write_text(json.dumps(doc.document))
"""


def test_a_gate_whose_load_generator_waits_for_the_cpus_notes_it(tmp_path: Path, tag: str) -> None:
    # The gate 10 nice levels below a spinner, both on one CPU and in this test's session (CFS
    # shares a CPU by weight inside a session's autogroup: 110 against 1024): its load
    # generator waits, as in a CI run at nice 10 beside a real vLLM. One CPU, so the rest of
    # the host is left to the other tests.
    cpu = min(os.sched_getaffinity(0))
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    spinner = subprocess.Popen([sys.executable, "-c", spin])

    def starve() -> None:
        os.sched_setaffinity(0, {cpu})
        os.nice(10)

    try:
        subprocess.run(
            [sys.executable, "-c", _STARVED, tag, str(tmp_path)],
            check=True,
            timeout=300,
            preexec_fn=starve,
        )
    finally:
        spinner.kill()
        spinner.wait()
    doc = json.loads((tmp_path / "doc.json").read_text())
    (note,) = [n for n in doc["notes"] if "waited for a CPU" in n]
    assert "In scenario steady" in note and "the load generator" in note, note
