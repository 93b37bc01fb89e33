"""Start a sim as a child process and wait until it serves.

Used by tests here and by anything else in the gate that needs a throwaway engine. Stdlib
only: launching must not import numpy into the caller. The router of a disaggregated sim
(``simengine.router``) announces itself the same way, so the same helpers start it
(``module=ROUTER_MODULE``); ``SimPool.start_pd`` starts a whole two-group engine.
"""

from __future__ import annotations

import http.client
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

from simengine.announce import parse_listening_line

SIM_MODULE = "simengine"
ROUTER_MODULE = "simengine.router"


class SimStartError(RuntimeError):
    """The process exited, or did not announce itself or become healthy in time."""


class _Closes:
    """A `with` block over it ends by `close()`, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass
class SimHandle(_Closes):
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    stderr_path: Path | None

    def stderr(self) -> str:
        if self.stderr_path is None:
            return ""
        return self.stderr_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit within ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        code = self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def close(self) -> None:
        """`kill`, the name a `with` block ends by."""
        self.kill()


def sim_command(flags: Sequence[str], *, port: int = 0, module: str = SIM_MODULE) -> list[str]:
    return [sys.executable, "-m", module, "--port", str(port), *flags]


def spawn(
    flags: Sequence[str],
    *,
    port: int = 0,
    stderr_path: Path | None = None,
    cwd: Path | None = None,
    module: str = SIM_MODULE,
) -> subprocess.Popen[bytes]:
    """Start the process without waiting; stdout is a pipe carrying the announcement line."""
    stderr = stderr_path.open("wb") if stderr_path is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            sim_command(flags, port=port, module=module),
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=cwd,
        )
    finally:
        if stderr_path is not None and not isinstance(stderr, int):
            stderr.close()


def read_announcement(proc: subprocess.Popen[bytes], timeout: float) -> tuple[str, int]:
    """Block until the sim prints where it listens; returns (url, port)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SimStartError("sim did not announce its port in time")
        readable, _, _ = select.select([proc.stdout], [], [], remaining)
        if not readable:
            continue
        line = proc.stdout.readline().decode(errors="replace")
        if not line:
            raise SimStartError(f"sim exited with code {proc.wait()} before listening")
        listening = parse_listening_line(line)
        if listening is not None:
            return listening.url, listening.port


def health_status(url: str, timeout: float = 2.0) -> int | None:
    """Status of GET /health, or None when nothing answers."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        return response.status
    except OSError:
        return None
    finally:
        conn.close()


def wait_healthy(
    url: str, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if health_status(url) == 200:
            return
        if proc is not None and proc.poll() is not None:
            raise SimStartError(f"sim exited with code {proc.returncode} while warming up")
        time.sleep(0.02)
    raise SimStartError(f"{url} did not become healthy within {timeout} s")


def launch(
    flags: Sequence[str],
    *,
    port: int = 0,
    stderr_path: Path | None = None,
    cwd: Path | None = None,
    ready: bool = True,
    timeout: float = 15.0,
    module: str = SIM_MODULE,
) -> SimHandle:
    """Start a sim and return once it listens (and, with ``ready``, once /health is 200)."""
    proc = spawn(flags, port=port, stderr_path=stderr_path, cwd=cwd, module=module)
    try:
        url, bound = read_announcement(proc, timeout)
        handle = SimHandle(proc, url, bound, stderr_path)
        if ready:
            wait_healthy(url, timeout, proc)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        raise
    return handle


@dataclass(frozen=True)
class PdSim:
    """A disaggregated sim: its prefill and decode workers and the router clients talk to."""

    router: SimHandle
    prefill: tuple[SimHandle, ...]
    decode: tuple[SimHandle, ...]

    @property
    def url(self) -> str:
        return self.router.url


@dataclass
class SimPool(_Closes):
    """Starts sims and remembers them so that one ``close`` always cleans every one up."""

    workdir: Path | None = None
    cwd: Path | None = None
    handles: list[SimHandle] = field(default_factory=list)

    def start(
        self, *flags: str, port: int = 0, ready: bool = True, module: str = SIM_MODULE
    ) -> SimHandle:
        stderr_path = None
        if self.workdir is not None:
            name = "router" if module == ROUTER_MODULE else "sim"
            stderr_path = self.workdir / f"{name}-{len(self.handles)}.stderr"
        handle = launch(
            flags, port=port, stderr_path=stderr_path, cwd=self.cwd, ready=ready, module=module
        )
        self.handles.append(handle)
        return handle

    def start_pd(
        self,
        *flags: str,
        prefill: Sequence[str] = (),
        decode: Sequence[str] = (),
        router: Sequence[str] = (),
        prefills: int = 1,
        decodes: int = 1,
        ready: bool = True,
    ) -> PdSim:
        """Prefill workers (``flags`` + ``prefill``), decode workers (``flags`` + ``decode``)
        and a router in front of them; with ``ready``, returns once the router is ready,
        which it is once every worker is."""
        p = tuple(
            self.start(*flags, *prefill, "--role", "prefill", ready=False) for _ in range(prefills)
        )
        d = tuple(
            self.start(*flags, *decode, "--role", "decode", ready=False) for _ in range(decodes)
        )
        urls = [a for h in p for a in ("--prefill", h.url)]
        urls += [a for h in d for a in ("--decode", h.url)]
        front = self.start(*urls, *router, ready=ready, module=ROUTER_MODULE)
        return PdSim(front, p, d)

    def spawn(self, *flags: str, port: int = 0) -> subprocess.Popen[bytes]:
        """Start without waiting, for tests of the startup phases themselves."""
        stderr_path = None
        if self.workdir is not None:
            stderr_path = self.workdir / f"sim-{len(self.handles)}.stderr"
        proc = spawn(flags, port=port, stderr_path=stderr_path, cwd=self.cwd)
        self.handles.append(SimHandle(proc, "", port, stderr_path))
        return proc

    def close(self) -> None:
        for handle in self.handles:
            handle.kill()
