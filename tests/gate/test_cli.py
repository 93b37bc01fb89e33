"""Whole gates through the real command: real sim engine processes, real HTTP, real SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, text

from gate.engines.logphases import LOG_PHASES

pytestmark = pytest.mark.slow

SIM = ["python", "-m", "simengine", "--port", "{port}", "--model", "{model}"]


def sim(tag: str, *flags: str) -> list[str]:
    return [*SIM, "--tag", tag, *flags]


def spec(
    tmp_path: Path,
    reference: dict[str, Any],
    candidate: dict[str, Any],
    *,
    requests: int = 400,
    rate: float = 40.0,
    short_ok: bool = True,
    **extra: Any,
) -> Path:
    """A spec of one steady scenario (400 requests at 40/s by default: 10 s, too short for the
    paired latency checks, so it allows short scenarios: most of these tests are about the
    command, not the verdict). `short_ok=False` leaves that out, for a verdict test that
    gives a scenario long enough to decide (`DECIDES`)."""
    if short_ok:
        extra = {"policy": {"short_scenarios": "allow"}} | extra
    doc = {
        "name": "t",
        "model": "demo-model",
        "reference": reference,
        "candidate": candidate,
        "scenarios": [
            {
                "name": "steady",
                "arrival": "poisson",
                "rate": rate,
                "requests": requests,
                "prompt_tokens": 64,
                "max_tokens": 16,
            }
        ],
        **extra,
    }
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def gate_argv(tmp_path: Path, *args: str) -> list[str]:
    """`python -m gate ARGS` on the test's own database and report folder."""
    db = f"sqlite:///{tmp_path / 'g.db'}"
    return [
        sys.executable,
        "-m",
        "gate",
        *args,
        "--db",
        db,
        "--report-dir",
        str(tmp_path / "reports"),
    ]


def gate(tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gate_argv(tmp_path, *args),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "GATE_DATA_DIR": str(tmp_path / ".gate")},
    )


def db_rows(tmp_path: Path, sql: str) -> list[Any]:
    eng = create_engine(f"sqlite:///{tmp_path / 'g.db'}")
    with eng.connect() as c:
        rows = list(c.execute(text(sql)))
    eng.dispose()
    return rows


# A steady scenario the paired latency checks can decide: 400 requests at 22/s (18 s) make
# 10 time blocks of 2 s (the plan refuses fewer than 8).
DECIDES: dict[str, Any] = {"requests": 400, "rate": 22.0, "short_ok": False}


@pytest.fixture
def tag(find_processes: Callable[[str], list[int]]) -> Iterator[str]:
    t = uuid.uuid4().hex
    yield t
    assert find_processes(t) == [], "an engine process outlived its gate"


# timed_gate: an A/A gate whose every check must pass or say no regression was shown; other tests
# on the cores make one engine's tail look slower now and then (a hold on steady.ttft.tail).
@pytest.mark.timed_gate
def test_identical_engines_continue(tmp_path: Path, tag: str) -> None:
    p = spec(
        tmp_path,
        {"command": sim(tag, "--seed", "1")},
        {"command": sim(tag, "--seed", "2")},
        **DECIDES,
    )
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "continue" and doc["reasons"] == []
    # One meaning of continue: the banner, the document's summary and its lists agree, and
    # each undecided check that did not hold is listed as not shown under the banner.
    assert doc["summary"].startswith("continue") and len(doc["summary"]) <= 140
    undecided = [c["id"] for c in doc["checks"] if c["decision"] == "undecided"]
    assert [n["check"] for n in doc["not_shown"]] == undecided
    banner = "CONTINUE" + (f", with {len(doc['warnings'])} warning" if doc["warnings"] else "")
    assert f"\n{banner}" in out.stderr
    for n in doc["not_shown"]:
        assert f"  not shown {n['message']}" in out.stderr
    assert "inconclusive" not in out.stderr
    ids = {c["id"] for c in doc["checks"]}
    assert {"steady.ttft.p50", "steady.itl.p50", "steady.errors", "startup.ready"} <= ids
    # The plan says what 392 paired requests per engine can detect, before the load.
    assert any(
        n.startswith("steady: 392 planned requests per engine in 10 blocks of 2 s")
        for n in doc["notes"]
    )
    # Nothing holds: every check passed, or is a latency check left undecided that says no
    # regression was shown (a quantile's also what it could have detected: at 392 requests the
    # p90 of two busy sims may not be pinned).
    for c in doc["checks"]:
        assert c["decision"] == "pass" or (
            c["decision"] == "undecided"
            and not c["required"]
            and "no regression was shown" in c["message"]
        ), c
    assert Path(doc["report"]).is_file() and Path(doc["document"]).is_file()
    ref, cand = doc["engines"]["reference"], doc["engines"]["candidate"]
    assert ref["placement"]["gpus"] != cand["placement"]["gpus"]
    for e in (ref, cand):
        # Every lifecycle phase of a launched engine and its teardown, in order on the gate's clock.
        # A phase read from the engine's log (the sim's `weights_loaded`) is marked only if a
        # poll of the log (every 0.2 s) comes before the engine is ready: on a busy machine it
        # does, on an idle one the sim is ready first. Either is right.
        lifecycle = [p for p in e["phases"] if p not in LOG_PHASES]
        assert lifecycle == [
            "launched",
            "process_up",
            "port_open",
            "healthy",
            "model_listed",
            "warmup_done",
            "ready",
            "stopped",
        ]
        times = list(e["phases"].values())
        assert times == sorted(times) and times[0] > 0
        assert e["ready_s"] > 0
    # The gate's own phases, before the engines': requested, then reserved.
    gate_phases = db_rows(
        tmp_path, "select phase, at_s from gate_phases where role = 'gate' order by at_s"
    )
    names = [p for p, _ in gate_phases]
    assert names[:2] == ["requested", "reserved"]
    assert gate_phases[1][1] <= min(ref["phases"]["launched"], cand["phases"]["launched"])
    # Persisted: the run, its phases, both arms' samples, every check; GPUs released.
    assert db_rows(tmp_path, "select state, verdict from gates") == [("complete", "continue")]
    assert db_rows(tmp_path, "select count(*) from sample_sets")[0][0] == 2
    assert db_rows(tmp_path, "select count(*) from checks")[0][0] == len(doc["checks"])
    assert db_rows(tmp_path, "select count(*) from gpu_leases")[0][0] == 0
    assert db_rows(tmp_path, "select state from reservations") == [("released",)]
    assert "continue" in out.stderr.lower()


# timed_gate: a hold on a TTFT regression of +50-100% that the paired latency checks must
# decide; other tests on the cores blur it, now and then to undecided (a continue).
@pytest.mark.timed_gate
def test_ttft_regression_holds_naming_ttft(tmp_path: Path, tag: str) -> None:
    p = spec(
        tmp_path,
        {"command": sim(tag, "--ttft-ms", "40")},
        {"command": sim(tag, "--ttft-ms", "60")},
        **DECIDES,
    )
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "hold"
    assert any("ttft" in r["check"] for r in doc["reasons"])
    assert doc["summary"].startswith("hold: ") and ".ttft." in doc["summary"]
    assert "\nHOLD  gate " in out.stderr
    fail = next(c for c in doc["checks"] if c["id"] == "steady.ttft.p50")
    assert fail["decision"] == "fail" and 1.3 < fail["ratio"] < 1.7
    assert fail["interval"][0] > fail["threshold"]


def test_demo_holds_on_ttft_and_exits_zero(tmp_path: Path) -> None:
    out = gate(tmp_path, "demo", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "hold"
    assert any("ttft" in r["check"].lower() or "TTFT" in r["message"] for r in doc["reasons"])
    assert "report:" in out.stderr and Path(doc["report"]).is_file()


def test_url_candidate_that_runs(tmp_path: Path, tag: str) -> None:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "simengine", "--port", str(port), "--tag", tag],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        p = spec(tmp_path, {"command": sim(tag)}, {"url": f"http://127.0.0.1:{port}"})
        out = gate(tmp_path, "run", str(p), "--json")
        doc = json.loads(out.stdout)
        assert out.returncode == 0, out.stderr
        assert doc["verdict"] == "continue"
        assert doc["engines"]["candidate"]["kind"] == "endpoint"
        assert "attached" in doc["engines"]["candidate"]["phases"]
        assert server.poll() is None, "an attached engine must not be torn down by the gate"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_url_where_nothing_listens(tmp_path: Path, tag: str) -> None:
    port = _free_port()
    p = spec(tmp_path, {"command": sim(tag)}, {"url": f"http://127.0.0.1:{port}"})
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "hold" and doc["state"] == "error"
    assert "candidate" in doc["reasons"][0]["message"]
    assert "unreachable" in doc["reasons"][0]["message"]
    assert db_rows(tmp_path, "select state, verdict from gates") == [("error", "hold")]
    assert db_rows(tmp_path, "select count(*) from gpu_leases")[0][0] == 0


def test_a_workload_files_mistake_refuses_the_spec(tmp_path: Path) -> None:
    """`gate run` reads a workload file before anything starts (relative to its working
    directory, no GATE_WORKLOAD_DIR set) and refuses the spec naming the scenario field, the
    file, the line and the record's field; nothing is reserved or launched."""
    (tmp_path / "chats.jsonl").write_text(
        '{"conversations": [{"from": "human", "value": "hi"}]}\n'
        '{"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]}\n'
    )
    p = tmp_path / "spec.yaml"
    scenario = {"name": "chat", "rate": 5, "requests": 10}
    scenario["workload"] = {"kind": "sharegpt", "file": "chats.jsonl"}
    p.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "model": "demo-model",
                "reference": {"url": "http://127.0.0.1:9"},
                "candidate": {"url": "http://127.0.0.1:9"},
                "scenarios": [scenario],
            }
        )
    )
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 2, out.stderr
    problem = "chats.jsonl line 2: conversations[1].from: two human turns in a row"
    assert f"scenarios[0].workload.file: {problem}" in out.stderr
    doc = json.loads(out.stdout)
    assert [r["check"] for r in doc["reasons"]] == ["spec.scenarios[0].workload.file"]
    assert not (tmp_path / "g.db").exists() or not db_rows(tmp_path, "select id from gates")


def test_spec_with_three_mistakes(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(
        "name: bad\nmodel: demo-model\n"
        "reference: {command: [python, -m, simengine], url: 'http://x:1'}\n"
        "candidate: {url: 'http://127.0.0.1:8001'}\n"
        "scenarios:\n  - {name: steady, rate: -1, requests: 10, max_tokens: 0}\n"
    )
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 2
    doc = json.loads(out.stdout)
    checks = {r["check"] for r in doc["reasons"]}
    assert checks == {"spec.reference", "spec.scenarios[0].rate", "spec.scenarios[0].max_tokens"}
    assert "3 mistakes" in out.stderr


def test_crash_mid_load_holds_naming_the_crash(tmp_path: Path, tag: str) -> None:
    p = spec(tmp_path, {"command": sim(tag)}, {"command": sim(tag, "--crash-after-requests", "60")})
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    crash = next(r for r in doc["reasons"] if r["check"] == "crash.candidate")
    assert "exited with code 1" in crash["message"]
    evidence = doc["engines"]["candidate"]["crash"]
    assert evidence["exit_code"] == 1
    # When, and the engine's last words: the sim logs why it crashed before it exits.
    assert evidence["at_s"] > doc["engines"]["candidate"]["phases"]["ready"]
    assert any("--crash-after-requests" in line for line in evidence["log_tail"])
    assert "--crash-after-requests" in crash["message"]
    assert doc["engines"]["reference"]["crash"] is None


@pytest.mark.parametrize(
    ("flags", "phase"),
    [(("--load-s", "600"), "port_open"), (("--warmup-s", "600"), "healthy")],
)
def test_a_hang_at_startup_holds_naming_the_phase(
    tmp_path: Path, tag: str, flags: tuple[str, ...], phase: str
) -> None:
    """A candidate that never gets ready: hold naming the phase it stuck in; nothing left."""
    p = spec(
        tmp_path,
        {"command": sim(tag)},
        {"command": sim(tag, *flags), "readiness_timeout_s": 3},
    )
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "hold" and doc["state"] == "error"
    reason = doc["reasons"][0]
    assert "candidate" in reason["message"] and f"stuck in phase {phase}" in reason["message"]
    assert phase not in doc["engines"]["candidate"]["phases"]
    assert db_rows(tmp_path, "select state, verdict from gates") == [("error", "hold")]
    assert db_rows(tmp_path, "select count(*) from gpu_leases")[0][0] == 0
    assert db_rows(tmp_path, "select state from reservations") == [("released",)]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_tears_down_and_records(tmp_path: Path, tag: str, sig: signal.Signals) -> None:
    p = spec(tmp_path, {"command": sim(tag)}, {"command": sim(tag)}, requests=2000, rate=20)
    proc = subprocess.Popen(
        gate_argv(tmp_path, "run", str(p), "--json"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GATE_DATA_DIR": str(tmp_path / ".gate")},
        # What a terminal's Ctrl-C reaches. A job started in the background of a
        # non-interactive shell (POSIX, Shell Command Language 2.11: "&" lists ignore SIGINT
        # and SIGQUIT) passes SIGINT on ignored, and Python then leaves it ignored (its
        # handler goes in only over SIG_DFL): so the test sets the default itself.
        preexec_fn=_default_sigint,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        if "scenario:steady" in line:
            break
    time.sleep(1.0)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + stderr
    doc = json.loads(stdout)
    assert doc["state"] == "cancelled" and doc["verdict"] == "hold"
    assert db_rows(tmp_path, "select state from gates") == [("cancelled",)]
    assert db_rows(tmp_path, "select count(*) from gpu_leases")[0][0] == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_blocked_reservation_holds_with_the_layer(tmp_path: Path, tag: str) -> None:
    p = spec(
        tmp_path,
        {"command": sim(tag)},
        {"command": sim(tag)},
        shape={"sku": "H200", "gpus_per_engine": 8},
    )
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "hold"
    assert doc["reasons"][0]["check"] == "gate.reservation_blocked"
    assert "(free_capacity)" in doc["reasons"][0]["message"]
    assert "needs 16" in doc["reasons"][0]["message"]
    assert doc["reservation"]["state"] == "blocked" and not doc["reservation"]["retryable"]
    assert doc["engines"]["reference"]["pid"] is None  # nothing was launched


def _hold_all_gpus(tmp_path: Path, ttl_s: float) -> None:
    from gate.core.database import make_engine, make_sessionmaker, upgrade
    from gate.reservations import leases
    from gate.reservations.allocator import ShapeRequest
    from gate.reservations.inventory import load_inventory

    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    upgrade(engine)
    leases.reserve(
        make_sessionmaker(engine),
        load_inventory(),
        ShapeRequest(gpus_per_engine=4),
        holder="another-gate",
        gate_id=None,
        ttl_s=ttl_s,
    )
    engine.dispose()


def test_blocked_by_another_gate_waits_then_holds(tmp_path: Path, tag: str) -> None:
    _hold_all_gpus(tmp_path, ttl_s=600)
    p = spec(tmp_path, {"command": sim(tag)}, {"command": sim(tag)}, shape={"wait_s": 2})
    t0 = time.monotonic()
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 2, out.stderr
    assert time.monotonic() - t0 >= 2
    doc = json.loads(out.stdout)
    assert doc["reservation"]["state"] == "blocked"
    assert doc["reservation"]["code"] == "lease_conflict" and doc["reservation"]["retryable"]
    assert "waiting_for_capacity" in out.stderr


def test_waits_for_an_expiring_lease_then_runs(tmp_path: Path, tag: str) -> None:
    """Another gate's lease holds every GPU until the gate says it waits; then the lease
    expires (its end moved into the past, as if its TTL ran out): the gate takes the GPUs and
    runs. Ordered by what the gate prints, not by a TTL racing the CLI's start-up."""
    _hold_all_gpus(tmp_path, ttl_s=600)
    p = spec(
        tmp_path, {"command": sim(tag)}, {"command": sim(tag)}, shape={"wait_s": 120}, requests=200
    )
    err = tmp_path / "stderr.txt"
    with err.open("w") as sink:
        proc = subprocess.Popen(
            gate_argv(tmp_path, "run", str(p), "--json"),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while "waiting_for_capacity" not in err.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.2)
            past = "2000-01-01 00:00:00.000000"
            eng = create_engine(f"sqlite:///{tmp_path / 'g.db'}")
            with eng.begin() as c:
                c.execute(text("update reservations set expires_at = :t"), {"t": past})
                c.execute(text("update gpu_leases set expires_at = :t"), {"t": past})
            eng.dispose()
            stdout, _ = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    doc = json.loads(stdout)
    assert doc["reservation"]["state"] == "released", err.read_text()
    assert db_rows(tmp_path, "select state from reservations order by id") == [
        ("expired",),
        ("released",),
    ]


def test_capacity_command(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gate",
            "capacity",
            "--inventory",
            "examples/inventory/gb200-nvl72.yaml",
            "--shape",
            "sku=GB200,gpus_per_engine=16,nodes_per_engine=4,engine_level=clique",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["gates"] == 3 and doc["engines"] == 7 and doc["level"] == "clique"
    assert [d["gates"] for d in doc["per_domain"]] == [2, 1]
    bad = subprocess.run(
        [sys.executable, "-m", "gate", "capacity", "--shape", "gpus=8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown key 'gpus'" in bad.stderr


def test_capacity_counts_whole_multi_group_gates() -> None:
    root = Path(__file__).resolve().parents[2]
    run = [sys.executable, "-m", "gate", "capacity", "--spec", "examples/specs/disaggregated.yaml"]
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60, cwd=root)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["inventory"] == "gb200-nvl72"  # the spec's own inventory
    assert doc["gates"] == 5 and [d["gates"] for d in doc["per_domain"]] == [3, 2]
    assert [g["role"] for g in doc["groups"]] == ["decode", "prefill"]  # the rarest first
    assert [g["role"] for g in doc["shape"]["groups"]] == ["prefill", "decode"]
    table = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=root)
    assert table.returncode == 0, table.stderr
    assert "5 whole gate shape(s) fit now" in table.stdout
    assert "each group alone" in table.stdout and "decode" in table.stdout
    blocked = subprocess.run(
        [
            sys.executable,
            "-m",
            "gate",
            "capacity",
            "--inventory",
            "examples/inventory/gb200-nvl72.yaml",
            "--shape",
            "sku=GB200,groups=prefill:4+decode:16x2@clique,connect=prefill/decode@clique",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert blocked.returncode == 0, blocked.stderr
    assert "blocked (topology)" in blocked.stdout
    assert "decode group needs 2 nodes with 8 free GPUs in one clique" in blocked.stdout


def test_compatibility_probes_run_on_both_engines(tmp_path: Path, tag: str) -> None:
    # 400 requests at 40/s, 5 time blocks: a short scenario's latency is left undecided (not
    # shown), but one of fewer than 4 blocks cannot be compared at all and holds.
    p = spec(tmp_path, {"command": sim(tag)}, {"command": sim(tag)})
    doc_spec = yaml.safe_load(p.read_text())
    doc_spec["scenarios"].append({"suite": "compatibility"})
    p.write_text(yaml.safe_dump(doc_spec))
    out = gate(tmp_path, "run", str(p), "--json")
    doc = json.loads(out.stdout)
    compat = [c for c in doc["checks"] if c["group"] == "compatibility"]
    assert compat and all(c["decision"] == "pass" for c in compat), out.stderr
    assert len(doc["probes"]) >= 10
    assert out.returncode == 0, out.stderr


def test_a_candidate_that_breaks_streaming_fails_compatibility(tmp_path: Path, tag: str) -> None:
    p = spec(
        tmp_path,
        {"command": sim(tag)},
        {"command": sim(tag, "--stream-error-rate", "1.0")},
        requests=200,
    )
    doc_spec = yaml.safe_load(p.read_text())
    doc_spec["scenarios"] = [{"suite": "compatibility"}]
    p.write_text(yaml.safe_dump(doc_spec))
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    failed = [r for r in doc["reasons"] if r["check"].startswith("compat.")]
    assert failed, doc["reasons"]


def test_correctness_suite_settings_are_validated(tmp_path: Path) -> None:
    p = spec(tmp_path, {"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"})
    doc_spec = yaml.safe_load(p.read_text())
    doc_spec["scenarios"] = [{"suite": "correctness", "probes": 8, "top_logprobs": 50}]
    p.write_text(yaml.safe_dump(doc_spec))
    out = gate(tmp_path, "run", str(p))
    assert out.returncode == 2
    assert "scenarios[0].probes" in out.stderr and "probes_count" in out.stderr


def test_run_refuses_a_spec_over_the_operators_caps(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gate run` obeys the same caps as the API (GATE_MAX_...): refused before anything is
    reserved or launched, each over-cap field named with the cap and its setting."""
    monkeypatch.setenv("GATE_MAX_SCENARIO_REQUESTS", "100")
    p = spec(tmp_path, {"command": sim(tag)}, {"command": sim(tag)}, requests=400, deadline_s=1e5)
    out = gate(tmp_path, "run", str(p), "--json")
    assert out.returncode == 2, out.stderr
    doc = json.loads(out.stdout)
    assert doc["state"] == "invalid" and doc["verdict"] == "hold"
    reasons = {r["check"]: r["message"] for r in doc["reasons"]}
    assert reasons == {
        "spec.scenarios[0].requests": "400 is above the cap of 100 requests per scenario "
        "(GATE_MAX_SCENARIO_REQUESTS)",
        "spec.deadline_s": "100000 is above the cap of 14400 seconds per gate "
        "(GATE_MAX_DEADLINE_S)",
    }
    assert (
        not (tmp_path / "g.db").exists()
        or db_rows(tmp_path, "select count(*) from gates")[0][0] == 0
    )
