"""Startup phases read from an engine's own log (gate/engines/logphases.py), against the log a
real vLLM 0.32.0 (CPU build, `bench/vllm/setup`) wrote while it started:
tests/support/captures/vllm/vllm-startup.log (`python -m vllm.entrypoints.openai.api_server
--model .vllm/models/tiny-a --dtype float32 --max-model-len 1024 --max-num-seqs 8`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from capture_replay import VLLM_CAPTURES

from gate.core.errors import ReadinessTimeout
from gate.engines.launchers import ProcessEngine
from gate.engines.lifecycle import Clock, PhaseLog
from gate.engines.logphases import MAX_LINE_CHARS, LogWatcher, match_line

STARTUP_LOG = VLLM_CAPTURES / "vllm-startup.log"


def watch(text: bytes, tmp_path: Path, chunks: int = 1) -> PhaseLog:
    """Feed `text` to a watcher in `chunks` appends (lines cut anywhere), draining after each."""
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    phases = PhaseLog("reference", Clock())
    watcher = LogWatcher(log, phases)
    step = max(1, len(text) // chunks)
    for i in range(0, len(text), step):
        with log.open("ab") as fh:
            fh.write(text[i : i + step])
        watcher.drain()
    watcher.drain()
    return phases


def test_a_real_vllm_startup_log_marks_each_step_in_the_order_vllm_took_them(
    tmp_path: Path,
) -> None:
    phases = watch(STARTUP_LOG.read_bytes(), tmp_path)
    assert list(phases.reached) == [
        "config_resolved",  # model.py: Resolved architecture: LlamaForCausalLM
        "weights_loaded",  # default_loader.py: Loading weights took 0.01 seconds
        "warmed_up",  # cpu_model_runner.py: Warming up done.
        "kv_cache_sized",  # kv_cache_utils.py: CPU KV cache size: 1,048,576 tokens
        "engine_initialized",  # core.py: init engine (...) took 33.30 s
        "api_up",  # entry.py: Starting vLLM server on http://127.0.0.1:8101
    ]


def test_lines_cut_across_reads_are_still_matched_once(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole = watch(STARTUP_LOG.read_bytes(), tmp_path / "a")
    cut = watch(STARTUP_LOG.read_bytes(), tmp_path / "b", chunks=997)
    assert list(cut.reached) == list(whole.reached)


def test_a_phase_is_marked_once_and_only_from_the_start_of_a_long_line() -> None:
    seen: set[str] = set()
    assert match_line("INFO Loading weights took 1.20 seconds", seen) == "weights_loaded"
    seen.add("weights_loaded")
    assert match_line("INFO Loading weights took 1.20 seconds", seen) is None
    hidden = "x" * MAX_LINE_CHARS + " KV cache size: 10 tokens"
    assert match_line(hidden, set()) is None
    # SGLang's lines (model_runner.py "Load weight end.", http_server.py "fired up")
    assert match_line("[2026-05-06] Load weight end. type=Llama", set()) == "weights_loaded"
    assert match_line("Capture cuda graph end. Time elapsed: 3 s", set()) == "warmed_up"


def test_an_engine_whose_log_says_where_it_stuck_is_named_by_that_step(tmp_path: Path) -> None:
    """A fake engine that logs vLLM's first steps and never opens its port: the timeout says
    the last step its log reached, and the phases keep it (the report's timeline shows it)."""
    lines = [
        ln
        for ln in STARTUP_LOG.read_text().splitlines()
        if "Resolved architecture" in ln or "Loading weights took" in ln
    ]
    script = (
        "import sys, time\n"
        + "".join(f"print({ln!r}, flush=True)\n" for ln in lines)
        + "time.sleep(60)\n"
    )
    phases = PhaseLog("candidate", Clock())
    eng = ProcessEngine(
        role="candidate",
        argv_template=["python", "-c", script],
        model="m",
        phases=phases,
        log_path=tmp_path / "candidate.log",
        readiness_timeout_s=3.0,
    )

    async def main() -> str:
        try:
            await eng.start()
        except ReadinessTimeout as exc:
            return str(exc)
        finally:
            await eng.stop()
        raise AssertionError("the engine never opened its port, so it cannot be ready")

    message = asyncio.run(main())
    assert "stuck in phase port_open" in message
    assert "its log last reached weights_loaded" in message
    assert {"config_resolved", "weights_loaded"} <= set(phases.reached)
    assert "kv_cache_sized" not in phases.reached
