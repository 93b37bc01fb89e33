"""Launchers against real processes: every lifecycle phase, failures named by phase, teardown."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from gate.core.errors import EngineError, EngineUnreachable, ReadinessTimeout
from gate.engines import keeper
from gate.engines.launchers import (
    EndpointEngine,
    ProcessEngine,
    free_port,
    port_listeners,
    render_argv,
)
from gate.engines.lifecycle import ENDPOINT_PHASES, PROCESS_PHASES, Clock, PhaseLog
from gate.engines.logphases import LOG_PHASES
from gate.reservations.allocator import EnginePlacement

SIM = [sys.executable, "-m", "simengine", "--port", "{port}", "--model", "{model}"]


def _engine(tmp_path: Path, argv: list[str], timeout: float = 20.0, **kw: object) -> ProcessEngine:
    return ProcessEngine(
        role="candidate",
        argv_template=argv,
        model="demo-model",
        phases=PhaseLog("candidate", Clock()),
        log_path=tmp_path / "engine.log",
        readiness_timeout_s=timeout,
        **kw,  # type: ignore[arg-type]
    )


def _start_then_stop(eng: ProcessEngine) -> None:
    """Start the engine and always stop it, whatever starting raised."""

    async def go() -> None:
        try:
            await eng.start()
        finally:
            await eng.stop()

    asyncio.run(go())


def test_render_argv_fills_placeholders_without_a_shell() -> None:
    argv = render_argv(
        ["vllm", "serve", "{model}", "--port={port}", "--tp", "{tp}", "$(rm -rf /)"],
        {"model": "m", "port": "8000", "tp": "2"},
    )
    assert argv == ["vllm", "serve", "m", "--port=8000", "--tp", "2", "$(rm -rf /)"]
    assert render_argv(["python", "-V"], {})[0] == sys.executable


# Records what the child really got (environment, working directory, rendered placeholders),
# then becomes the sim with the rest of its arguments.
_RECORD_THEN_SIM = (
    "import json, os, runpy, sys; "
    "out, gpus, tp = sys.argv[1:4]; "
    "json.dump({'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), "
    "'mark': os.environ.get('GATE_TEST_MARK'), 'secret': os.environ.get('GATE_WEBHOOK_SECRET'), "
    "'cwd': os.getcwd(), 'gpus': gpus, 'tp': tp}, "
    "open(out, 'w')); "
    "sys.argv = ['sim', *sys.argv[4:]]; "
    "runpy.run_module('simengine', run_name='__main__')"
)


def test_process_engine_walks_every_phase_and_sets_gpus(
    tmp_path: Path, find_processes: Callable[[str], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "GATE_WEBHOOK_SECRET", "the-service-secret"
    )  # the worker's, not the engine's
    tag = uuid.uuid4().hex
    placement = EnginePlacement("candidate", (("h0", (2, 3)),), "H200", "h0")
    record = tmp_path / "child.json"
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    argv = [sys.executable, "-c", _RECORD_THEN_SIM, str(record), "{gpus}", "{tp}"]
    argv += ["--port", "{port}", "--model", "{model}", "--tag", tag]
    argv += ["--load-s", "0.2", "--warmup-s", "0.2"]
    eng = _engine(
        tmp_path, argv, placement=placement, env={"GATE_TEST_MARK": "m1"}, cwd=str(workdir)
    )

    async def go() -> None:
        await eng.start()
        assert eng.crashed() is None
        await eng.stop()

    asyncio.run(go())
    # A phase read from the engine's log (the sim's `weights_loaded`, its 0.2 s of warm-up) is
    # marked only if a poll of the log (every 0.2 s) falls inside it: a matter of timing.
    assert [p for p in eng.phases.reached if p not in LOG_PHASES] == list(PROCESS_PHASES)
    times = [eng.phases.reached[p] for p in PROCESS_PHASES]
    assert times == sorted(times)
    # --load-s 0.2 keeps the port closed, then 0.2 s of warm-up answers 503: both are visible.
    # (Measured from the launch: when the port is first seen open depends on the readiness
    # poll and a busy machine's scheduling, while neither phase can come sooner than this.)
    assert eng.phases.reached["port_open"] - eng.phases.reached["launched"] >= 0.2
    assert eng.phases.reached["healthy"] - eng.phases.reached["launched"] >= 0.4
    # What the engine process itself saw: its GPUs, the spec's env and cwd, the placeholders.
    child = json.loads(record.read_text())
    assert child == {
        "cuda": "2,3",
        "mark": "m1",  # the spec's env, even named GATE_*
        "secret": None,  # the service's settings never reach an engine
        "cwd": str(workdir),
        "gpus": "2,3",
        "tp": "2",
    }
    assert find_processes(tag) == []


def test_a_program_that_cannot_start_is_named_at_process_up(tmp_path: Path) -> None:
    eng = _engine(tmp_path, [str(tmp_path / "no-such-engine"), "--port", "{port}"])

    with pytest.raises(EngineError) as info:
        _start_then_stop(eng)
    assert info.value.phase == "process_up"
    assert "could not start" in info.value.message and "no-such-engine" in info.value.message
    assert list(eng.phases.reached) == ["launched"]


def test_hang_at_startup_times_out_naming_the_phase(
    tmp_path: Path, find_processes: Callable[[str], list[int]]
) -> None:
    tag = uuid.uuid4().hex
    eng = _engine(tmp_path, [sys.executable, "-c", "import time; time.sleep(60)", tag], timeout=1.0)

    with pytest.raises(ReadinessTimeout) as info:
        _start_then_stop(eng)
    assert info.value.phase == "port_open"
    assert "stuck in phase port_open" in info.value.message
    assert find_processes(tag) == []


def test_stuck_in_warmup_names_healthy(
    tmp_path: Path, find_processes: Callable[[str], list[int]]
) -> None:
    tag = uuid.uuid4().hex
    # 6 s for the port to open (a sim opens it in well under one; 1.5 s was sometimes too
    # little on busy cores, which then named port_open), then stuck in its 60 s of warm-up.
    eng = _engine(tmp_path, [*SIM, "--warmup-s", "60", "--tag", tag], timeout=6.0)

    with pytest.raises(ReadinessTimeout) as info:
        _start_then_stop(eng)
    assert info.value.phase == "healthy" and "503" in info.value.message
    assert find_processes(tag) == []


def test_exit_during_startup_is_reported_with_code(tmp_path: Path) -> None:
    eng = _engine(tmp_path, [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)"])

    with pytest.raises(EngineError, match="exited with code 3"):
        _start_then_stop(eng)
    assert "bad flag" in "\n".join(eng.log_tail())


def test_wrong_model_is_named(tmp_path: Path, find_processes: Callable[[str], list[int]]) -> None:
    tag = uuid.uuid4().hex
    argv = [sys.executable, "-m", "simengine", "--port", "{port}", "--model", "other"]
    eng = _engine(tmp_path, [*argv, "--tag", tag])

    with pytest.raises(EngineError, match="does not serve model 'demo-model'") as info:
        _start_then_stop(eng)
    assert info.value.phase == "model_listed"
    assert find_processes(tag) == []


def test_teardown_kills_the_whole_process_group(
    tmp_path: Path, find_processes: Callable[[str], list[int]]
) -> None:
    """An engine that forks a child (like a server with workers): both must be gone."""
    tag = uuid.uuid4().hex
    script = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{tag}-child']); "
        f"import runpy; sys.argv = ['sim', '--port', sys.argv[1], '--tag', '{tag}']; "
        "runpy.run_module('simengine', run_name='__main__')"
    )
    eng = _engine(tmp_path, [sys.executable, "-c", script, "{port}"])

    async def go() -> None:
        await eng.start()
        assert find_processes(f"{tag}-child")
        await eng.stop()

    asyncio.run(go())
    deadline = time.monotonic() + 5
    while find_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert find_processes(tag) == []


def test_crash_is_detected_with_exit_status_and_log(tmp_path: Path) -> None:
    eng = _engine(tmp_path, [*SIM, "--crash-after-requests", "0"])

    async def go() -> None:
        import httpx

        await eng.start()
        async with httpx.AsyncClient(base_url=eng.base_url) as c:
            with pytest.raises(httpx.HTTPError):
                await c.post(
                    "/v1/completions",
                    json={"model": "demo-model", "prompt": "a b", "max_tokens": 3},
                )
        for _ in range(100):
            if eng.crashed():
                break
            await asyncio.sleep(0.02)
        crash = eng.crashed()
        assert crash is not None and crash.exit_code == 1
        assert "exited with code 1" in crash.description
        # The evidence carries the engine's last words, and the crash came after readiness.
        assert any("--crash-after-requests" in line for line in crash.log_tail)
        assert crash.at_s > eng.phases.reached["model_listed"]
        await eng.stop()

    asyncio.run(go())


def test_endpoint_unreachable_is_fast_and_named() -> None:
    port = free_port()
    eng = EndpointEngine(
        "candidate", f"http://127.0.0.1:{port}", "demo-model", PhaseLog("candidate", Clock())
    )
    t0 = time.monotonic()
    with pytest.raises(EngineUnreachable, match="unreachable"):
        asyncio.run(eng.start())
    assert time.monotonic() - t0 < 10
    assert list(eng.phases.reached) == ["attached"]


def test_endpoint_attach_times_readiness(tmp_path: Path) -> None:
    server = _engine(tmp_path, SIM)

    async def go() -> EndpointEngine:
        await server.start()
        try:
            eng = EndpointEngine(
                "candidate", server.base_url, "demo-model", PhaseLog("candidate", Clock())
            )
            await eng.start()
            return eng
        finally:
            await server.stop()

    eng = asyncio.run(go())
    assert list(eng.phases.reached) == list(ENDPOINT_PHASES)


def test_taken_port_is_retried_on_a_fresh_one(tmp_path: Path) -> None:
    """Another process binds the picked port first: the engine is relaunched elsewhere."""
    import socket

    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", 0))  # bound, not listening: connects are refused, binds fail
    taken = squatter.getsockname()[1]
    eng = _engine(tmp_path, [*SIM, "--load-s", "0"])
    eng.port, eng.base_url = taken, f"http://127.0.0.1:{taken}"

    try:
        _start_then_stop(eng)
    finally:
        squatter.close()
    assert eng.port != taken
    assert "port_retry" in eng.phases.reached
    assert list(eng.phases.reached)[-1] == "model_listed"


def test_a_port_answered_by_another_engine_is_not_taken_for_this_one(tmp_path: Path) -> None:
    """Another engine binds the picked port first and answers on it (a CI run: a group
    engine's decode worker died of "address already in use" while a neighbour's sim answered
    its readiness probes, and its router waited 300 s). The listener's pid is not the
    engine's, so it is relaunched on a fresh port and serves from its own process."""
    squatter = _engine(tmp_path / "squatter", [*SIM, "--load-s", "0"])
    # the engine starts slower than the squatter answers: its readiness sees the squatter
    eng = _engine(tmp_path, [*SIM, "--load-s", "1"])

    async def go() -> None:
        await squatter.start()
        try:
            eng.port, eng.base_url = squatter.port, squatter.base_url
            await eng.start()
            try:
                holders = await asyncio.to_thread(port_listeners, eng.port)
                assert eng._proc is not None and holders is not None
                assert holders & {eng._proc.pid, *keeper.descendants(eng._proc.pid)}
            finally:
                await eng.stop()
        finally:
            await squatter.stop()

    asyncio.run(go())
    assert eng.port != squatter.port
    assert "port_retry" in eng.phases.reached
    assert list(eng.phases.reached)[-1] == "model_listed"


def test_port_listeners_reads_the_listening_socket_and_its_process() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert port_listeners(port) == set()  # bound, not listening
        s.listen()
        assert port_listeners(port) == {os.getpid()}
    assert port_listeners(port, Path("/nonexistent")) is None


def test_presets_render_argv_without_a_shell() -> None:
    from gate.engines.presets import PRESETS, preset_argv

    vals = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "port": "8000",
        "host": "127.0.0.1",
        "tp": "2",
        "gpus": "0,1",
    }
    vllm = render_argv(
        preset_argv("vllm", binary="/opt/vllm-0.11/bin/vllm", args=("--enforce-eager",)), vals
    )
    assert vllm[:3] == ["/opt/vllm-0.11/bin/vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert vllm[vllm.index("--tensor-parallel-size") + 1] == "2" and vllm[-1] == "--enforce-eager"
    sgl = render_argv(preset_argv("sglang", python="/venvs/sglang/bin/python"), vals)
    assert sgl[:3] == ["/venvs/sglang/bin/python", "-m", "sglang.launch_server"]
    assert sgl[sgl.index("--served-model-name") + 1] == vals["model"]
    trt = render_argv(preset_argv("trtllm"), vals)
    assert trt[0] == "trtllm-serve" and trt[trt.index("--tp_size") + 1] == "2"
    assert set(PRESETS) == {"vllm", "sglang", "trtllm", "sim"}


def test_sim_preset_launches(tmp_path: Path) -> None:
    from gate.engines.presets import preset_argv

    eng = _engine(tmp_path, preset_argv("sim", args=("--load-s", "0")))

    _start_then_stop(eng)
    assert "model_listed" in eng.phases.reached
