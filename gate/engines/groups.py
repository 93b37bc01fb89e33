"""An engine of several worker groups (prefill and decode) served as one unit behind a router.

One `ProcessEngine` per group, on that group's GPUs (its leader node's, as for every local
process), and one for the router, which is the engine's entry point: load, readiness and the
verdict's URL are the router's. Every port is picked before anything starts, so any argv can
name any group's address (`{url:decode}`); the groups start together and the router once all
are ready. A group that exits is a crash of the whole engine, named by group
(`decode group: process exited with code 1`); teardown stops the router and every group, on
every path, each stop attempted whatever the others did.

Phases: the engine's own (`launched` ... `model_listed`, the router's readiness) are the ones
judged; each group's are kept beside them as `GROUP.PHASE` (`decode.healthy`), so the report
can show each group's startup.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.core.errors import EngineError, ReadinessTimeout
from gate.engines.describe import engine_doc
from gate.engines.launchers import ProcessEngine, render_argv
from gate.engines.lifecycle import PROCESS_PHASES, CrashInfo, PhaseLog
from gate.reservations.allocator import EnginePlacement
from gate.verdict.document import EngineDoc, GroupDoc, PlacementDoc

ROUTER = "router"


@dataclass
class WorkerSpec:
    """One process of the engine: a group's worker or the router, before its placeholders."""

    name: str  # the group role, or `router`
    argv_template: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


class _GroupProcess(ProcessEngine):
    """A ProcessEngine whose argv also gets the group placeholders, on its group's GPUs."""

    group: str = ""
    gpus: str = ""
    peers: dict[str, ProcessEngine] | None = None

    def argv(self) -> list[str]:
        values = {
            "port": str(self.port),
            "host": self.host,
            "model": self.model,
            "gpus": self.gpus,
            "group_gpus": self.gpus,
            "tp": str(len(self.gpus.split(","))) if self.gpus else "1",
            "role": self.group,
        }
        for name, peer in (self.peers or {}).items():
            values[f"url:{name}"] = peer.base_url
            values[f"host:{name}"] = peer.host
            values[f"port:{name}"] = str(peer.port)
        return render_argv(self.argv_template, values)

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["CUDA_VISIBLE_DEVICES"] = self.gpus  # the group's, never the engine leader's
        return env


def _child_log(parent: PhaseLog, group: str) -> PhaseLog:
    def sink(role: str, phase: str, at_s: float, detail: str | None) -> None:
        parent.mark(f"{group}.{phase}", detail)

    return PhaseLog(role=parent.role, clock=parent.clock, sink=sink)


class GroupedEngine:
    """The Engine protocol over a router and its worker groups (see the module docstring)."""

    def __init__(
        self,
        *,
        role: str,
        workers: list[WorkerSpec],
        router: WorkerSpec,
        model: str,
        phases: PhaseLog,
        log_dir: Path,
        placement: EnginePlacement | None,
        readiness_timeout_s: float,
        gate_id: str,
        term_grace_s: float,
        host: str = "127.0.0.1",
    ) -> None:
        self.role = role
        self.phases = phases
        self.placement = placement
        self.processes: dict[str, _GroupProcess] = {}
        for w in [*workers, router]:
            gpus = ""
            if w.name != ROUTER and placement is not None:
                gpus = placement.group(w.name).cuda_visible_devices
            proc = _GroupProcess(
                role=role,
                argv_template=w.argv_template,
                model=model,
                phases=_child_log(phases, w.name),
                log_path=log_dir / f"{role}.{w.name}.log",
                placement=None,
                env=dict(w.env),
                cwd=w.cwd,
                readiness_timeout_s=readiness_timeout_s,
                host=host,
                gate_id=f"{gate_id}-{w.name}" if gate_id else "",
                term_grace_s=term_grace_s,
            )
            proc.group, proc.gpus = w.name, gpus
            self.processes[w.name] = proc
        for proc in self.processes.values():
            proc.peers = {n: p for n, p in self.processes.items() if n != ROUTER}
        self.router = self.processes[ROUTER]
        self.base_url = self.router.base_url
        self.pid: int | None = None
        self._stopped = False

    @property
    def launched(self) -> bool:
        return True

    def own_pids(self) -> list[int]:
        """Every group's and the router's root process, those launched so far."""
        return [pid for p in self.processes.values() for pid in p.own_pids()]

    @property
    def retired_cpu_s(self) -> float:
        return sum(p.retired_cpu_s for p in self.processes.values())

    @property
    def groups(self) -> dict[str, _GroupProcess]:
        return {n: p for n, p in self.processes.items() if n != ROUTER}

    async def start(self) -> None:
        self.phases.mark("launched", ", ".join(self.processes))
        await start_all(self.role, {n: p.start() for n, p in self.groups.items()})
        self.phases.mark("process_up", "every group ready; starting the router")
        await start_all(self.role, {ROUTER: self.router.start()})
        self.base_url = self.router.base_url  # a port retry may have moved it
        self.pid = self.router.pid
        for phase in PROCESS_PHASES[2:]:  # the router's readiness is the engine's
            self.phases.mark(phase)

    def crashed(self) -> CrashInfo | None:
        if self._stopped:
            return None
        for name, proc in self.processes.items():
            crash = proc.crashed()
            if crash is not None:
                return member_crash(self.role, name, crash)
        return None

    def log_tail(self, lines: int = 40) -> list[str]:
        return self.router.log_tail(lines)

    async def stop(self) -> None:
        """Router first (no new requests reach the groups), then every group at once."""
        self._stopped = True
        try:
            with contextlib.suppress(Exception):
                await self.router.stop()
        finally:
            results = await asyncio.gather(
                *(p.stop() for p in self.groups.values()), return_exceptions=True
            )
            for proc, res in zip(self.groups.values(), results, strict=True):
                if isinstance(res, BaseException):
                    proc.kill_now()

    def kill_now(self) -> None:
        for proc in self.processes.values():
            proc.kill_now()

    def describe(self, placement: PlacementDoc | None, crash: CrashInfo | None) -> EngineDoc:
        doc = engine_doc(self, "process", placement, crash, log=str(self.router.log_path))
        groups = [
            GroupDoc(
                role=name,
                url=proc.base_url,
                pid=proc.pid,
                gpus=[int(g) for g in proc.gpus.split(",")] if proc.gpus else [],
                node=self.placement.group(name).nodes[0]
                if self.placement is not None and name != ROUTER
                else None,
                phases={k: round(v, 3) for k, v in proc.phases.reached.items()},
                crashed=crash is not None and crash.group == name,
                log=str(proc.log_path),
                log_tail=proc.log_tail(10),
            )
            for name, proc in self.processes.items()
        ]
        return doc.model_copy(update={"groups": groups})


def who(name: str) -> str:
    """A member of a grouped engine as its errors name it."""
    return "router" if name == ROUTER else f"{name} group"


def member_crash(role: str, name: str, crash: CrashInfo) -> CrashInfo:
    """A member's crash as the grouped engine's: named for the member, tagged with its group."""
    return CrashInfo(
        role=role,
        at_s=crash.at_s,
        exit_code=crash.exit_code,
        description=f"{who(name)}: {crash.description}",
        log_tail=crash.log_tail,
        group=name,
    )


async def start_all(
    role: str,
    starts: Mapping[str, Coroutine[Any, Any, Any]],
    *,
    keep_timeouts: bool = False,
) -> None:
    """Start the members at once; the first failure cancels the rest and is raised as the
    engine's, naming the member (in `starts`' order). keep_timeouts: a member's
    ReadinessTimeout stays one (else every member's EngineError becomes an EngineError)."""
    tasks = {n: asyncio.create_task(s) for n, s in starts.items()}
    try:
        await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    for name, t in tasks.items():
        exc = t.exception() if t.done() and not t.cancelled() else None
        if isinstance(exc, EngineError):
            keep = keep_timeouts and isinstance(exc, ReadinessTimeout)
            raise named(ReadinessTimeout if keep else EngineError, role, name, exc) from None
        if exc is not None:
            raise exc


def named(cls: type[EngineError], role: str, name: str, exc: EngineError) -> EngineError:
    """A member's failure as the grouped engine's, naming the member (`decode group: ...`)."""
    what = str(exc).removeprefix(f"{role} engine ")
    return cls(role, exc.phase, f"{who(name)}: {what}")
