"""What an engine's pods say, read from the API's pod objects (pure: no API call here).

A `PodView` per pod (node, phase, deletion, each container's waiting, running or terminated
state and restarts), and the verdicts the Kubernetes launcher (`kubernetes.py`) walks its phases
and watches for crashes by: scheduled, pulled, running, an image pull or container start that
cannot succeed by waiting (ended at once, naming the image or container), the first sign of a
crash (a restart with the previous container's reason and exit code, an ended or deleted pod, a
pod that vanished or was replaced), and what a stuck phase's pods say for a timeout's message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubernetes import client

from gate.engines.manifests import COMPONENT_LABEL

PULL_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
CREATING = frozenset({"ContainerCreating", "PodInitializing"})
START_FAILURES = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "StartError"}
)


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    image: str
    restarts: int = 0
    image_id: str | None = None  # the kubelet's imageID: the digest it runs, once pulled
    waiting: str | None = None
    waiting_message: str | None = None
    running: bool = False
    terminated: str | None = None
    exit_code: int | None = None
    last_terminated: str | None = None
    last_exit_code: int | None = None

    @property
    def pulled(self) -> bool:
        """Past image pull: running, ended, restarted, or waiting for something else
        (CrashLoopBackOff also means the image is there)."""
        if self.running or self.terminated is not None or self.restarts > 0:
            return True
        return self.waiting is not None and self.waiting not in CREATING | PULL_FAILURES


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    uid: str
    component: str | None = None
    node: str | None = None
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    unschedulable: str | None = None
    deleting: bool = False
    containers: tuple[ContainerView, ...] = ()


def _container_view(status: client.V1ContainerStatus) -> ContainerView:
    state, last = status.state, status.last_state
    waiting = state.waiting if state else None
    terminated = state.terminated if state else None
    last_terminated = last.terminated if last else None
    return ContainerView(
        name=status.name,
        image=status.image,
        image_id=status.image_id or None,
        restarts=status.restart_count,
        waiting=(waiting.reason or "Waiting") if waiting else None,
        waiting_message=waiting.message if waiting else None,
        running=bool(state and state.running),
        terminated=(terminated.reason or "Terminated") if terminated else None,
        exit_code=terminated.exit_code if terminated else None,
        last_terminated=(last_terminated.reason or "Terminated") if last_terminated else None,
        last_exit_code=last_terminated.exit_code if last_terminated else None,
    )


def pod_view(pod: client.V1Pod) -> PodView:
    meta = pod.metadata or client.V1ObjectMeta()
    status = pod.status or client.V1PodStatus()
    unschedulable = None
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            unschedulable = f"{cond.reason or 'Unschedulable'}: {cond.message or ''}".strip()
    return PodView(
        name=meta.name or "",
        uid=meta.uid or "",
        component=(meta.labels or {}).get(COMPONENT_LABEL),
        node=pod.spec.node_name if pod.spec else None,
        phase=status.phase,
        reason=status.reason,
        message=status.message,
        unschedulable=unschedulable,
        deleting=meta.deletion_timestamp is not None,
        containers=tuple(_container_view(c) for c in status.container_statuses or []),
    )


@dataclass(frozen=True, slots=True)
class CrashEvidence:
    description: str
    exit_code: int | None
    pod: str | None
    previous: bool  # the previous container instance's log says why


def _ended(reason: str | None, code: int | None) -> str:
    return f"{reason or 'Terminated'}" + (f", exit code {code}" if code is not None else "")


def find_crash(pods: Sequence[PodView], seen: Mapping[str, str]) -> CrashEvidence | None:
    """The first sign that an engine that was up is not any more; `seen` maps each pod name
    ever observed to its uid, so a pod that vanished or was replaced counts too."""
    by_name = {p.name: p for p in pods}
    for name, uid in seen.items():
        now = by_name.get(name)
        if now is None or now.uid != uid:
            what = "disappeared" if now is None else "was replaced by a new pod"
            return CrashEvidence(f"pod {name} {what}", None, None, False)
    for p in pods:
        for c in p.containers:
            if c.restarts > 0:
                why = _ended(c.last_terminated, c.last_exit_code)
                return CrashEvidence(
                    f"container {c.name} in pod {p.name} restarted ({why}; {c.restarts} restarts)",
                    c.last_exit_code,
                    p.name,
                    True,
                )
            if c.terminated is not None:
                why = _ended(c.terminated, c.exit_code)
                return CrashEvidence(
                    f"container {c.name} in pod {p.name} exited ({why})", c.exit_code, p.name, False
                )
        if p.phase in ("Failed", "Succeeded"):
            why = ": ".join(x for x in (p.reason, p.message) if x) or p.phase
            return CrashEvidence(f"pod {p.name} ended ({p.phase}: {why})", None, p.name, False)
        if p.deleting:
            return CrashEvidence(f"pod {p.name} is being deleted", None, p.name, False)
    return None


def all_scheduled(pods: Sequence[PodView], expected: int) -> bool:
    return len(pods) >= expected and all(p.node for p in pods)


def all_pulled(pods: Sequence[PodView], expected: int) -> bool:
    return (
        len(pods) >= expected
        and all(p.containers for p in pods)
        and all(c.pulled for p in pods for c in p.containers)
    )


def all_running(pods: Sequence[PodView], expected: int) -> bool:
    return (
        len(pods) >= expected
        and all(p.containers for p in pods)
        and all(c.running for p in pods for c in p.containers)
    )


def _first_waiting(
    pods: Sequence[PodView], reasons: frozenset[str]
) -> tuple[PodView, ContainerView, str] | None:
    """The first container waiting for one of `reasons`, with its pod and why it waits."""
    for p in pods:
        for c in p.containers:
            if c.waiting in reasons:
                msg = f": {c.waiting_message}" if c.waiting_message else ""
                return p, c, f"{c.waiting}{msg}"
    return None


def pull_failure(pods: Sequence[PodView]) -> str | None:
    if (found := _first_waiting(pods, PULL_FAILURES)) is None:
        return None
    p, c, why = found
    return f"could not pull image {c.image} for pod {p.name} ({why})"


def start_failure(pods: Sequence[PodView]) -> str | None:
    if (found := _first_waiting(pods, START_FAILURES)) is None:
        return None
    p, c, why = found
    return f"could not start container {c.name} in pod {p.name} ({why})"


def stuck_detail(pods: Sequence[PodView], expected: int, phase: str) -> str:
    """What the pods say about the phase they are stuck in, for the timeout's message."""
    if len(pods) < expected:
        return f"{len(pods)}/{expected} pods exist"
    if phase == "pods_scheduled":
        for p in pods:
            if not p.node and p.unschedulable:
                return f"pod {p.name}: {p.unschedulable}"
        done = sum(1 for p in pods if p.node)
        return f"{done}/{expected} pods scheduled"
    for p in pods:
        if not p.containers:
            return f"pod {p.name}: no container status yet"
        for c in p.containers:
            if not c.running:
                msg = f": {c.waiting_message}" if c.waiting_message else ""
                return f"pod {p.name} container {c.name}: {c.waiting or 'not running'}{msg}"
    return ""
