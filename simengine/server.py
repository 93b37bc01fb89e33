"""Process lifecycle of a sim: load, listen, warm up, serve, shut down.

It imitates a real engine so the gate's own startup handling gets exercised: the port stays
closed while "loading weights", then /health answers 503 while "warming up", and only then 200.
Long phases (minutes, like a 70B model's) are plain waits that a SIGTERM cuts short.
The numpy-backed modules are imported inside the loading phase, so their import time counts
towards ``--load-s`` instead of adding to it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sys
import time
import traceback
from typing import TYPE_CHECKING

from simengine import rxstamp
from simengine.announce import base_url, format_listening_line
from simengine.config import SimConfig
from simengine.http11 import ConnectionHabits, HttpProtocol, cut_connections, start_server

if TYPE_CHECKING:  # numpy-backed: imported for real inside the loading phase
    from simengine.app import SimApp
    from simengine.gpu import SimGpus
    from simengine.model import ToyModel, ToyTokenizer
    from simengine.truth import TruthLog


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind one socket before serving, so port 0 yields a single, known port."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = rxstamp.listener(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds``; True if a stop signal arrived first."""
    if seconds <= 0:
        return stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True


def _die_with_the_engine(task: asyncio.Task[None]) -> None:
    """A dead engine loop would leave a server that accepts requests and never answers."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    traceback.print_exception(exc, file=sys.stderr)
    log("sim: the engine loop failed; exiting")
    os._exit(70)


async def serve(config: SimConfig) -> int:
    """Run one sim process to completion; the return value is the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    started = time.monotonic()
    log("sim: loading weights")
    # Imported here, not at the top: numpy's import time belongs to the loading phase.
    from simengine.app import SimApp
    from simengine.truth import TruthLog

    tokenizer, model = _load(config)
    # Real construction work counts towards --load-s instead of adding to it.
    if await _stopped_within(stop, config.load_s - (time.monotonic() - started)):
        log("sim: stopped while loading")
        return 0

    try:
        sock = bind_socket(config.host, config.port)
    except OSError as exc:
        log(f"sim: cannot listen on {config.host}:{config.port}: {exc}")
        return 1
    try:
        truth = TruthLog(config.truth_log) if config.truth_log else None
    except OSError as exc:
        sock.close()
        log(f"sim: cannot write the truth log {config.truth_log}: {exc}")
        return 1
    app = SimApp(config, tokenizer, model, truth=truth)
    connections: set[HttpProtocol] = set()
    habits = ConnectionHabits(
        idle_timeout_s=config.keep_alive_timeout_s,
        max_requests=config.max_requests_per_connection,
        announce=config.announce_keep_alive,
    )
    server = await start_server(app.handle, sock, connections, habits=habits, stats=app.connections)
    port = int(sock.getsockname()[1])
    app.address = (config.host, port)
    print(format_listening_line(config.host, port), flush=True)
    engine_task = loop.create_task(app.engine.run())
    engine_task.add_done_callback(_die_with_the_engine)
    if truth is not None:
        truth.start()
    gpus = _gpus(config, app, loop)

    log("sim: warming up")
    crash: asyncio.TimerHandle | None = None
    if not await _stopped_within(stop, config.warmup_s):
        app.mark_ready()
        if gpus is not None:
            gpus[0].ready_at = time.monotonic()
        if config.crash_after_s is not None:
            crash = loop.call_later(
                config.crash_after_s,
                app.crash,
                f"crashing {config.crash_after_s:g} s after ready (--crash-after-s)",
            )
        role = "" if config.role == "both" else f" as the {config.role} worker"
        log(f"sim: ready on {base_url(config.host, port)}{role}")
        await stop.wait()

    log("sim: shutting down")
    if crash is not None:
        crash.cancel()
    if gpus is not None:
        gpus[1].cancel()
    await _shut_down(server, connections, engine_task, truth)
    log(f"sim: {app.connections.line()}")
    return 0


def _gpus(
    config: SimConfig, app: SimApp, loop: asyncio.AbstractEventLoop
) -> tuple[SimGpus, asyncio.Task[None]] | None:
    """The simulated GPUs (simengine/gpu.py) and the task that writes their state, if any."""
    from simengine.gpu import sim_gpus

    gpus = sim_gpus(
        config.gpu_state_dir,
        config.gpu_memory_gib,
        config.gpu_idle_w,
        config.gpu_j_per_token,
        config.gpu_xids,
    )
    if gpus is None:
        return None
    engine = app.engine
    task = loop.create_task(gpus.run(lambda: (engine.stats.generation_tokens, engine.running)))
    return gpus, task


def _load(config: SimConfig) -> tuple[ToyTokenizer, ToyModel]:
    """The toy tokenizer and weights, kept out of the garbage collector's way."""
    from simengine.model import Numerics, ToyModel, ToyTokenizer

    tokenizer = ToyTokenizer(config.vocab_size)
    numerics = Numerics(config.logit_noise, config.numeric_bug, config.seed)
    model = ToyModel(config.vocab_size, config.model_seed, numerics=numerics)
    # Everything loaded so far lives as long as the process: keeping it out of the cyclic
    # collector's scans avoids pauses of several milliseconds in the middle of streams.
    gc.freeze()
    return tokenizer, model


async def _shut_down(
    server: asyncio.Server,
    connections: set[HttpProtocol],
    engine_task: asyncio.Task[None],
    truth: TruthLog | None,
) -> None:
    """Stop listening, cut every connection, stop the engine, close the truth log."""
    # The aborted handlers finish (they write their ground truth) before the log closes.
    await cut_connections(server, connections)
    engine_task.cancel()
    await server.wait_closed()
    if truth is not None:
        truth.close()
