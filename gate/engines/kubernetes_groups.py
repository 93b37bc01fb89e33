"""A kubernetes engine of several worker groups (prefill and decode) behind a router pod.

The Kubernetes twin of `gate.engines.groups`: one `KubernetesEngine` per group, each a Pod
(one node) or a LeaderWorkerSet (several) on that group's reserved nodes and GPUs, named
`<engine>-<group>` with a Service `<engine>-<group>-http`, and one for the router: a Pod
without GPUs on the first group's leader node (inside the reservation, tolerating its taints),
whose Service is the engine's entry point. Every object is owned by the gate's one Lease, so a
crashed gate's whole engine is collected with it.

Every Service name is known before anything is created, so any argv can name any group's
address (`{url:decode}` is `http://<engine>-decode-http.<ns>.svc:<port>`). The groups start
together and the router once all are ready (as for processes: a router may probe its
backends as it starts). The engine's own phases are those every member reached, so `launched`
is when the last member's objects exist and `model_listed` is the router's; each member's
phases are kept beside them as `GROUP.PHASE` (`decode.pods_scheduled`, `router.healthy`).

A group's pod that restarts (OOMKilled), exits, fails or vanishes is a crash of the whole
engine named by group (`CrashInfo.group`); teardown stops the router and then every group, on
every path (a create that failed, a readiness timeout, a crash), each stop attempted whatever
the others did.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kubernetes import client

from gate.core.errors import EngineError
from gate.engines import kubernetes as k8s
from gate.engines.describe import engine_doc
from gate.engines.gate_lease import GateLease
from gate.engines.groups import member_crash, start_all, who
from gate.engines.lifecycle import CrashInfo, PhaseLog
from gate.engines.manifests import ROUTER, EngineWorkload, dns_part, lease_name
from gate.verdict.document import EngineDoc, GroupDoc, KubernetesDoc, PlacementDoc

if TYPE_CHECKING:
    from gate.engines.launchers import Engine


def group_refs(
    groups: Mapping[str, EngineWorkload], cluster_domain: str | None = None
) -> dict[str, str]:
    """`{url:G}`, `{host:G}`, `{port:G}` of every group: its Service inside the cluster."""
    out: dict[str, str] = {}
    suffix = f".{cluster_domain}" if cluster_domain else ""
    for name, w in groups.items():
        out[f"url:{name}"] = w.service_url(cluster_domain)
        out[f"host:{name}"] = f"{w.service}.{w.namespace}.svc{suffix}"
        out[f"port:{name}"] = str(w.port)
    return out


class GroupedKubernetesEngine:
    """The Engine protocol over a router pod and its worker groups (see the module docstring).

    `base_url_override` points the router elsewhere (the engine's address for the load),
    `group_url_overrides` each group's readiness probe (a port-forward, a test server); the
    argv placeholders keep the in-cluster Service addresses either way."""

    def __init__(
        self,
        *,
        groups: Mapping[str, EngineWorkload],
        router: EngineWorkload,
        phases: PhaseLog,
        api_client: client.ApiClient,
        lease: GateLease | None = None,
        readiness_timeout_s: float = 1800.0,
        base_url_override: str | None = None,
        group_url_overrides: Mapping[str, str] | None = None,
        reserved_gpus: Mapping[str, tuple[int, ...]] | None = None,
        **options: Any,
    ) -> None:
        if router.group != ROUTER or any(w.group != name for name, w in groups.items()):
            raise ValueError("each group's workload names its group, the router's `router`")
        self.role = router.role
        self.phases = phases
        self.api_client = api_client
        self.workload = router  # its namespace is the engine's (the Lease is shared by it)
        if lease is None:  # standalone, as KubernetesEngine: a Lease of its own
            lease = GateLease(
                api_client,
                namespace=router.namespace,
                gate_id=router.gate_id,
                name=f"{lease_name(router.gate_id)}-{dns_part(router.role)}",
            )
        self.lease: GateLease = lease
        self.readiness_timeout_s = readiness_timeout_s
        self.reserved_gpus = dict(reserved_gpus or {})  # the leader node's, for the report
        overrides = dict(group_url_overrides or {})
        self.members: dict[str, k8s.KubernetesEngine] = {}
        # Read from the module at each call, so a test can stand a reachable class in for it.
        for name, w in [*groups.items(), (ROUTER, router)]:
            self.members[name] = k8s.KubernetesEngine(
                w,
                self._member_log(name),
                api_client,
                lease=lease,
                readiness_timeout_s=readiness_timeout_s,
                base_url_override=base_url_override if name == ROUTER else overrides.get(name),
                **options,
            )
        self.router = self.members[ROUTER]
        self.base_url = self.router.base_url
        self.service_url = self.router.service_url
        self.pid: int | None = None
        self._stopped = False

    def _member_log(self, name: str) -> PhaseLog:
        def sink(role: str, phase: str, at_s: float, detail: str | None) -> None:
            self.phases.mark(f"{name}.{phase}", detail)
            if phase not in self.phases.reached and all(
                phase in m.phases.reached for m in self.members.values()
            ):
                self.phases.mark(phase)

        return PhaseLog(role=self.phases.role, clock=self.phases.clock, sink=sink)

    @property
    def launched(self) -> bool:
        return True

    @property
    def groups(self) -> dict[str, k8s.KubernetesEngine]:
        return {n: m for n, m in self.members.items() if n != ROUTER}

    # -- start ---------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.readiness_timeout_s
        await start_all(
            self.role, {n: m.start() for n, m in self.groups.items()}, keep_timeouts=True
        )
        # The router gets what is left of the engine's budget, not a fresh one.
        self.router.readiness_timeout_s = max(deadline - loop.time(), 0.001)
        await start_all(self.role, {ROUTER: self.router.start()}, keep_timeouts=True)

    # -- watching ------------------------------------------------------------------------------

    def crashed(self) -> CrashInfo | None:
        if self._stopped:
            return None
        found = [(n, c) for n, m in self.members.items() if (c := m.crashed()) is not None]
        if not found:
            return None
        name, crash = min(found, key=lambda nc: nc[1].at_s)  # the first to go says why
        return member_crash(self.role, name, crash)

    def log_tail(self, lines: int = 40) -> list[str]:
        return self.router.log_tail(lines)

    # -- stop ----------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Router first (no new requests reach the groups), then every group at once; each
        stop is attempted, and what none could delete is said once at the end."""
        self._stopped = True
        problems: list[str] = []
        try:
            await self.router.stop()
        except Exception as exc:
            problems.append(f"router: {exc}")
        results = await asyncio.gather(
            *(m.stop() for m in self.groups.values()), return_exceptions=True
        )
        for name, res in zip(self.groups, results, strict=True):
            if isinstance(res, BaseException):
                problems.append(f"{who(name)}: {res}")
                with contextlib.suppress(Exception):
                    self.members[name].kill_now()
        if problems:
            raise EngineError(self.role, "stopped", "teardown failed: " + "; ".join(problems))

    def kill_now(self) -> None:
        self._stopped = True
        for m in self.members.values():
            with contextlib.suppress(Exception):
                m.kill_now()

    # -- the report ----------------------------------------------------------------------------

    def describe(self, placement: PlacementDoc | None, crash: CrashInfo | None) -> EngineDoc:
        objects = [
            f"{m['kind']} {w.namespace}/{m['metadata']['name']}"
            for w, made in ((e.workload, e.manifests) for e in self.members.values())
            if made is not None
            for m in made.objects
        ]
        r = self.router.workload
        kube = KubernetesDoc(
            namespace=r.namespace,
            image=", ".join(dict.fromkeys(m.workload.image for m in self.members.values())),
            workload=", ".join(
                f"{'LeaderWorkerSet' if m.workload.multi_node else 'Pod'} {m.workload.name}"
                for m in self.members.values()
            ),
            clique=next(
                (m.workload.clique for m in self.groups.values() if m.workload.clique), None
            ),
            service_url=self.service_url,
            lease=self.lease.name,
            objects=objects,
        )
        doc = engine_doc(self, "kubernetes", placement, crash, kubernetes=kube)
        groups = [
            GroupDoc(
                role=name,
                url=m.service_url,
                node=m.workload.nodes[0] if m.workload.nodes else None,
                gpus=list(self.reserved_gpus.get(name, ())),
                phases={k: round(v, 3) for k, v in m.phases.reached.items()},
                crashed=crash is not None and crash.group == name,
                log=f"pod {m.workload.namespace}/{m.leader_pod()}",
                log_tail=m.log_tail(10),
            )
            for name, m in self.members.items()
        ]
        return doc.model_copy(update={"groups": groups})


if TYPE_CHECKING:

    def _is_an_engine(engine: GroupedKubernetesEngine) -> Engine:
        return engine
