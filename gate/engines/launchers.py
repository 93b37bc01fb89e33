"""Launchers: a local process (argv template) or an endpoint that is already running.

A process engine runs in its own process group (and dies with the gate via PDEATHSIG on Linux),
so teardown reaches every child it spawned: SIGTERM to the group, a grace period, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from gate.access.network import check_allowed, check_always
from gate.core.errors import EngineError, PortTaken, UrlRefused
from gate.engines import keeper, orphans
from gate.engines.describe import engine_doc
from gate.engines.lifecycle import ENDPOINT_PHASES, PROCESS_PHASES, CrashInfo, PhaseLog
from gate.engines.logphases import LOG_PHASES, LogWatcher
from gate.engines.readiness import wait_ready
from gate.reservations.allocator import EnginePlacement
from gate.telemetry.host_cpu import tree_cpu_s
from gate.verdict.document import EngineDoc, PlacementDoc

TERM_GRACE_S = 5.0  # the keeper's grace: SIGTERM to every process of the engine, then SIGKILL
KEEPER_SLACK_S = 3.0  # for the keeper to kill and reap what outlived the grace
KEEPER = Path(keeper.__file__)
PORT_ATTEMPTS = 3
PORT_TAKEN_MARKERS = ("address already in use", "errno 98", "eaddrinuse")
ATTACH_CONNECT_TIMEOUT_S = 5.0
SERVICE_ENV_PREFIX = "GATE_"


class Engine(Protocol):
    role: str
    base_url: str
    phases: PhaseLog
    pid: int | None

    async def start(self) -> None: ...

    def crashed(self) -> CrashInfo | None: ...

    async def stop(self) -> None: ...

    def log_tail(self, lines: int = 40) -> list[str]: ...

    @property
    def launched(self) -> bool: ...

    def describe(self, placement: PlacementDoc | None, crash: CrashInfo | None) -> EngineDoc:
        """The engine for the verdict document (gate/engines/describe.py)."""
        ...


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out; the engine binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_listeners(port: int, proc: Path = Path("/proc")) -> set[int] | None:
    """The pids holding a listening TCP socket on `port` (any address), read from
    /proc/net/tcp and tcp6 (state 0A) and each process's fds; None where those tables are not
    there (not Linux). A process whose fds cannot be read is not among them."""
    inodes: set[str] = set()
    tables = 0
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not tables:
        return None
    pids: set[int] = set()
    if not inodes:
        return pids
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    pids.add(int(entry.name))
                    break
    return pids


def render_argv(template: list[str], values: dict[str, str]) -> list[str]:
    """Fill `{name}` placeholders by plain replacement: no format(), no shell, ever."""
    out = []
    for item in template:
        for key, val in values.items():
            item = item.replace("{" + key + "}", val)
        out.append(item)
    if out and out[0] in ("python", "python3"):
        # The gate's own interpreter, so `python -m simengine` works inside any venv.
        out[0] = sys.executable
    return out


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the gate process dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _kept(argv: list[str], grace_s: float = TERM_GRACE_S) -> list[str]:
    """The engine's argv under its keeper (keeper.py: a subreaper that ends the engine's
    whole process tree with it), on Linux; elsewhere the argv as it is."""
    if sys.platform != "linux":
        return argv
    return [sys.executable, "-I", str(KEEPER), "--grace", f"{grace_s:g}", "--", *argv]


def _unstartable(program: str, path: str, cwd: str | None) -> str | None:
    """Why `program` cannot be executed (as execvp would look it up), or None."""
    if "/" in program:
        target = Path(cwd or ".") / program
        if not target.exists():
            return "no such file"
        return None if os.access(target, os.X_OK) and target.is_file() else "not an executable"
    return None if shutil.which(program, path=path) else f"not found on PATH ({path})"


def _tail(path: Path, lines: int) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64_000))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return list(deque(data.splitlines(), maxlen=lines))


@dataclass
class ProcessEngine:
    role: str
    argv_template: list[str]
    model: str
    phases: PhaseLog
    log_path: Path
    placement: EnginePlacement | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    readiness_timeout_s: float = 300.0
    host: str = "127.0.0.1"
    gate_id: str = ""  # names the engine's processes (orphans.py); default: this object
    term_grace_s: float = TERM_GRACE_S  # SIGTERM to SIGKILL at teardown (sized to the lease)

    def __post_init__(self) -> None:
        self.gate_id = self.gate_id or f"engine-{os.getpid()}-{id(self):x}"
        self.port = free_port(self.host)
        self.base_url = f"http://{self.host}:{self.port}"
        self.pid: int | None = None
        self.retired_cpu_s = 0.0  # CPU seconds of attempts killed for a port retry
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._stopped = False

    @property
    def launched(self) -> bool:
        return True

    def argv(self) -> list[str]:
        gpus = self.placement.cuda_visible_devices if self.placement else ""
        tp = str(len(self.placement.gpus)) if self.placement else "1"
        values = {"port": str(self.port), "host": self.host, "model": self.model, "gpus": gpus}
        values["tp"] = tp
        return render_argv(self.argv_template, values)

    def environment(self) -> dict[str, str]:
        """The worker's environment without the gate's own settings (`GATE_*`: the database
        URL, the webhook secret, the callback token are the service's, never an engine's),
        plus the spec's `env`, CUDA_VISIBLE_DEVICES from the reservation."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(SERVICE_ENV_PREFIX)}
        env.update(self.env or {})
        env[orphans.MARK] = orphans.mark_for(self.gate_id, self.role)  # after the spec's env
        if self.placement is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.placement.cuda_visible_devices
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    async def start(self) -> None:
        """Launch and wait until ready. The port is picked just before launch; if another
        process binds it first (the engine dies with "address already in use" before the port
        opens), the engine is relaunched on a fresh port, a few times at most."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                await self._launch_once()
                return
            except EngineError as exc:
                if attempt == PORT_ATTEMPTS or exc.phase != "port_open":
                    raise
                if not isinstance(exc, PortTaken) and not _port_taken(self.log_path, log_start):
                    raise
                old = self.port
                self._reap()
                # the relaunch logs its startup again: its steps are its own, not the first's
                # (nor what another process's answers on the old port marked)
                for phase in (*LOG_PHASES, *PROCESS_PHASES[2:]):
                    self.phases.reached.pop(phase, None)
                self.port = free_port(self.host)
                self.base_url = f"http://{self.host}:{self.port}"
                self.phases.mark("port_retry", f"port {old} was taken; relaunching on {self.port}")

    def own_pids(self) -> list[int]:
        """The engine's root process (the keeper, the engine below it), once launched."""
        return [self._proc.pid] if self._proc is not None else []

    def _reap(self) -> None:
        if self._proc is not None:
            # its CPU time stays the engine's own: once killed, no tree holds it
            self.retired_cpu_s += tree_cpu_s(self._proc.pid) or 0.0
            self.kill_now()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    async def _launch_once(self) -> None:
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        argv = self.argv()
        env = self.environment()
        self._log = self.log_path.open("ab")
        self.phases.mark("launched", " ".join(argv))
        # The keeper execs the engine: a program that cannot start is named here, as a failed
        # exec of our own would be, not found later as an exit code of 127.
        problem = _unstartable(argv[0], env.get("PATH", os.defpath), self.cwd)
        if problem is not None:
            raise EngineError(self.role, "process_up", f"could not start {argv[0]!r}: {problem}")
        try:
            # Popen only forks and execs; it does not wait, so calling it here is fine.
            self._proc = subprocess.Popen(  # noqa: ASYNC220
                _kept(argv, self.term_grace_s),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except OSError as exc:
            raise EngineError(
                self.role, "process_up", f"could not start {argv[0]!r}: {exc}"
            ) from None
        # Popen returns once exec succeeded (an exec failure raises above): the program runs.
        self.pid = self._proc.pid
        self.phases.mark("process_up", f"pid {self.pid}")
        # The engine's own startup steps, read from its log while it starts (logphases.py).
        watcher = LogWatcher(self.log_path, self.phases, offset=log_start)
        watching = asyncio.create_task(watcher.run())
        try:
            await wait_ready(
                role=self.role,
                base_url=self.base_url,
                model=self.model,
                phases=self.phases,
                order=PROCESS_PHASES,
                timeout_s=self.readiness_timeout_s,
                alive=self._why_dead,
            )
        except EngineError as exc:
            watcher.drain()
            raise _with_log_phase(exc, self.phases) from None
        finally:
            watching.cancel()
            # waits for the watcher to end without swallowing a cancel of this task itself
            await asyncio.wait([watching])
        watcher.drain()
        await asyncio.to_thread(self._own_port)

    def _own_port(self) -> None:
        """Raise PortTaken when what answered on the engine's port is another process's
        socket. The port is picked free and bound by the engine later; in between another
        program can bind it, and if that one answers (another gate's engine: a CI run's
        group-engine gate found its decode worker "ready" on a neighbour's sim while its own
        had died of "address already in use", and its router waited 300 s for it), readiness
        alone would take it for the engine. No claim where the listener cannot be read (not
        Linux: port_listeners finds nothing)."""
        holders = port_listeners(self.port) if self._proc is not None else None
        if not holders or self._proc is None:
            return
        ours = {self._proc.pid, *keeper.descendants(self._proc.pid)}
        if holders & ours:
            return
        raise PortTaken(
            self.role,
            "port_open",
            f"port {self.port} answered from another process (pid "
            f"{', '.join(str(p) for p in sorted(holders))}), not this engine's: something else "
            "bound it first",
        )

    def _why_dead(self) -> str | None:
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is None:
            return None
        return _describe_exit(code)

    def crashed(self) -> CrashInfo | None:
        if self._stopped or self._proc is None:
            return None
        code = self._proc.poll()
        if code is None:
            return None
        return CrashInfo(
            role=self.role,
            at_s=self.phases.clock.now_s(),
            exit_code=code,
            description=_describe_exit(code),
            log_tail=tuple(self.log_tail(20)),
        )

    def log_tail(self, lines: int = 40) -> list[str]:
        return _tail(self.log_path, lines)

    def describe(self, placement: PlacementDoc | None, crash: CrashInfo | None) -> EngineDoc:
        return engine_doc(self, "process", placement, crash, log=str(self.log_path))

    def kill_now(self) -> None:
        """Synchronous last resort: SIGKILL the whole group (used when async teardown can't
        run), and whatever of the engine left the group."""
        if self._proc is not None and self._proc.poll() is None:
            tree = keeper.descendants(self._proc.pid) if sys.platform == "linux" else []
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            for pid in tree:  # the keeper's tree: what left the group, marked or not
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
        if self._proc is not None:
            orphans.kill_marked(self.gate_id, self.role)

    async def stop(self) -> None:
        self._stopped = True
        proc = self._proc
        if proc is not None:
            try:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    loop = asyncio.get_running_loop()
                    grace = self.term_grace_s + min(KEEPER_SLACK_S, self.term_grace_s)
                    deadline = loop.time() + grace
                    # Polling a child's exit: no event to await without a SIGCHLD watcher.
                    while proc.poll() is None and loop.time() < deadline:  # noqa: ASYNC110
                        await asyncio.sleep(0.02)
                # The leader may be gone while children it forked still hold the group.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                if proc.poll() is None:
                    proc.wait(timeout=5)
            finally:
                self.kill_now()
        if self._log is not None:
            self._log.close()
            self._log = None


def _with_log_phase(exc: EngineError, phases: PhaseLog) -> EngineError:
    """`exc` with the last step the engine's log reached, if it reached one: a startup stuck
    at /health says whether the weights loaded, the KV cache was sized, or neither."""
    logged = [(at, p) for p, at in phases.reached.items() if p in LOG_PHASES]
    if not logged:
        return exc
    at, phase = max(logged)
    message = str(exc).removeprefix(f"{exc.role} engine ")
    out = type(exc)(exc.role, exc.phase, f"{message} (its log last reached {phase} at {at:.1f}s)")
    return out


def _port_taken(log_path: Path, since: int) -> bool:
    try:
        with log_path.open("rb") as fh:
            fh.seek(since)
            text = fh.read(200_000).decode("utf-8", "replace").lower()
    except OSError:
        return False
    return any(marker in text for marker in PORT_TAKEN_MARKERS)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"process was killed by {name}"
    return f"process exited with code {code}"


@dataclass
class EndpointEngine:
    """An engine that is already running: attach, launch nothing, still time readiness."""

    role: str
    base_url: str
    model: str
    phases: PhaseLog
    readiness_timeout_s: float = 300.0
    pid: int | None = None
    allow: list[str] | None = None  # a caller's URL: the operator's allow-list, again

    @property
    def launched(self) -> bool:
        return False

    async def start(self) -> None:
        self.phases.mark("attached", self.base_url)
        # The spec checked the URL's syntax; what its name resolves to is checked now, and a
        # URL a caller named is held to the allow-list again (its name may point elsewhere
        # since the request was accepted; the gate may have waited in the queue for minutes).
        try:
            if self.allow is not None:
                await asyncio.to_thread(check_allowed, self.base_url, self.allow, loopback=False)
            else:
                await asyncio.to_thread(check_always, self.base_url)
        except UrlRefused as exc:
            raise EngineError(self.role, "attached", f"at {self.base_url} refused: {exc}") from None
        await wait_ready(
            role=self.role,
            base_url=self.base_url,
            model=self.model,
            phases=self.phases,
            order=ENDPOINT_PHASES,
            timeout_s=self.readiness_timeout_s,
            connect_timeout_s=ATTACH_CONNECT_TIMEOUT_S,
        )

    def crashed(self) -> CrashInfo | None:
        return None

    async def stop(self) -> None:
        return None

    def log_tail(self, lines: int = 40) -> list[str]:
        return []

    def describe(self, placement: PlacementDoc | None, crash: CrashInfo | None) -> EngineDoc:
        return engine_doc(self, "endpoint", placement, crash)

    def kill_now(self) -> None:
        return None
