"""Flagger's scheduler, played as its code runs, against the fake API server's objects.

One `tick()` is one pass of `advanceCanary` for a Deployment canary with a mesh provider
(progressive weights; the Kubernetes provider forces blue/green, scheduler.go:470-480),
reduced to what decides which hook is called, with which phase and checksum, and what happens
to the canary and its workloads. Followed from fluxcd/flagger at
15bd6ad555e6c935da55f0ab95977be74c149bd6:

- pkg/controller/scheduler.go:281-290 `shouldAdvance` (852-884): Progressing, Waiting,
  WaitingPromotion, Promoting and Finalising always advance; Failed first re-syncs
  LastAppliedSpec (863); otherwise only a changed target (pkg/canary/spec.go:32-49
  `hasSpecChanged`: an empty LastAppliedSpec, or a hash other than LastAppliedSpec that is not
  LastPromotedSpec).
- scheduler.go:323 `checkCanaryStatus` (886-933): Progressing, WaitingPromotion, Promoting and
  Finalising go on; any other phase calls the confirm-rollout hooks (904) with the canary's
  current phase; refused, it sets Waiting (scheduler_hooks.go:44-64) and *returns*: the pass
  ends before the rollback hooks. Confirmed, it scales the target up and SyncStatus
  (Progressing) writes LastAppliedSpec (925; status.go:50), which changes the checksum.
- scheduler.go:327-350 `hasCanaryRevisionChanged` (935-946): a new revision while Progressing
  or WaitingPromotion restarts the analysis as Progressing, without confirm-rollout again.
- scheduler.go:368-377: rollback hooks while Progressing, Waiting or WaitingPromotion
  (scheduler_hooks.go:126-139: 2xx means roll back), then `rollback` (948-998): Failed,
  target scaled to zero, LastAppliedSpec re-synced.
- scheduler.go:381-425: Promoting -> Finalising -> Succeeded (target scaled to zero).
- scheduler.go:492-504, 565-636 `runCanary`: the weight rises by `stepWeight` each pass up to
  `maxWeight`; there the confirm-promotion hooks (scheduler_hooks.go:67-95, payload phase
  Progressing) gate `Promote` (deployment_controller.go:65-135: the primary's pod template
  becomes the target's).
- Every payload: `{name, namespace, phase, checksum, metadata}` with checksum =
  `canaryChecksum` (webhook.go:144-154) of TrackedConfigs and LastAppliedSpec, and any status
  above 202 is a refusal (webhook.go:90-92).

`ComputeHash` (spec.go:54-66) is FNV-32a over spew's dump of the pod template; here it is FNV-32a
over the template's canonical JSON: other bytes, the same evolution, which is what the gate sees.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from k8s_fake import ObjectStore

DEPLOYMENTS = "apps/deployments"
CANARIES = "flagger.app/canaries"
Hook = Callable[[str, dict[str, Any]], int]  # (hook type, payload) -> HTTP status


def fnv32a(data: bytes) -> str:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return str(h)


def compute_hash(value: Any) -> str:
    return fnv32a(json.dumps(value, sort_keys=True).encode())


def deployment(name: str, namespace: str, image: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"containers": [{"name": "engine", "image": image}]},
            },
        },
    }


@dataclass
class Flagger:
    """A Canary of Deployment `target` in `namespace`, its primary and its pods."""

    store: ObjectStore
    hook: Hook
    namespace: str = "serving"
    name: str = "llama"
    target: str = "llama"
    webhooks: list[dict[str, Any]] = field(default_factory=list)
    step_weight: int = 50
    max_weight: int = 50
    digests: dict[str, str] = field(default_factory=dict)  # image -> sha256:… its pods report
    calls: list[tuple[str, str, str, int]] = field(default_factory=list)  # type, phase, sum, code
    events: list[str] = field(default_factory=list)

    # -- the objects ---------------------------------------------------------------------------

    def deploy(self, image: str) -> None:
        """The user's `kubectl set image` (or GitOps) on the target Deployment."""
        existing = self.store.get(DEPLOYMENTS, self.namespace, self.target)
        if existing is None:
            self.store.create(
                DEPLOYMENTS, deployment(self.target, self.namespace, image, {"app": self.target})
            )
        else:
            existing["spec"]["template"]["spec"]["containers"][0]["image"] = image

    def template(self, name: str) -> dict[str, Any]:
        obj = self.store.get(DEPLOYMENTS, self.namespace, name)
        assert obj is not None, name
        return obj["spec"]["template"]  # type: ignore[no-any-return]

    def image(self, name: str) -> str:
        return str(self.template(name)["spec"]["containers"][0]["image"])

    @property
    def canary(self) -> dict[str, Any]:
        obj = self.store.get(CANARIES, self.namespace, self.name)
        assert obj is not None
        return obj

    @property
    def status(self) -> dict[str, Any]:
        return self.canary.setdefault("status", {})  # type: ignore[no-any-return]

    @property
    def phase(self) -> str:
        return str(self.status.get("phase", ""))

    def checksum(self) -> str:
        """webhook.go:144-154."""
        return compute_hash(
            {
                "TrackedConfigs": self.status.get("trackedConfigs"),
                "LastAppliedSpec": self.status.get("lastAppliedSpec", ""),
            }
        )

    def _pods(self, workload: str, replicas: int) -> None:
        """What the ReplicaSet controller and kubelet make of a Deployment: its pods, Running,
        each reporting the digest of its image (containerStatuses[].imageID)."""
        for key in [k for k in self.store.objects if k[0] == "pods" and k[1] == self.namespace]:
            labels = self.store.objects[key]["metadata"].get("labels") or {}
            if labels.get("app") == workload:
                del self.store.objects[key]
        image = self.image(workload)
        for i in range(replicas):
            digest = self.digests.get(image)
            repo = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image
            self.store.create(
                "pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{workload}-{compute_hash([image, i])}",
                        "namespace": self.namespace,
                        "labels": {"app": workload},
                    },
                    "spec": {"containers": [{"name": "engine", "image": image}]},
                    "status": {
                        "phase": "Running",
                        "containerStatuses": [
                            {
                                "name": "engine",
                                "image": image,
                                "imageID": f"docker.io/{repo}@{digest}" if digest else "",
                                "ready": True,
                                "restartCount": 0,
                            }
                        ],
                    },
                },
            )

    def _scale(self, workload: str, replicas: int) -> None:
        obj = self.store.get(DEPLOYMENTS, self.namespace, workload)
        assert obj is not None
        obj["spec"]["replicas"] = replicas
        self._pods(workload, replicas)

    def _sync_status(self, phase: str, **extra: Any) -> None:
        """status.go:32-69 `syncCanaryStatus`: the phase, and LastAppliedSpec = hash(target)."""
        st = self.status
        st.update(phase=phase, canaryWeight=0, failedChecks=0, iterations=0, **extra)
        st["lastAppliedSpec"] = compute_hash(self.template(self.target))
        if phase == "Initialized":
            st["lastPromotedSpec"] = st["lastAppliedSpec"]

    # -- the scheduler ---------------------------------------------------------------------------

    def initialise(self) -> None:
        """The Canary is created: Flagger makes `<target>-primary` from the target, marks the
        canary Initialized and scales the target to zero."""
        self.store.create(
            CANARIES,
            {
                "apiVersion": "flagger.app/v1beta1",
                "kind": "Canary",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "targetRef": {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": self.target,
                    },
                    "analysis": {"webhooks": self.webhooks},
                },
            },
        )
        primary = f"{self.target}-primary"
        self.store.create(
            DEPLOYMENTS,
            deployment(primary, self.namespace, self.image(self.target), {"app": primary}),
        )
        self._pods(primary, 2)
        self._sync_status("Initialized")
        self._scale(self.target, 0)

    def _call(self, kind: str, phase: str) -> list[int]:
        codes = []
        for w in self.webhooks:
            if w["type"] != kind:
                continue
            payload = {
                "name": self.name,
                "namespace": self.namespace,
                "phase": phase,
                "checksum": self.checksum(),
                "metadata": dict(w.get("metadata") or {}),
            }
            code = self.hook(kind, payload)
            self.calls.append((kind, phase, payload["checksum"], code))
            codes.append(code)
            if code > 202 and kind != "rollback":
                break  # confirm hooks stop at the first refusal
            if code <= 202 and kind == "rollback":
                break  # the first rollback signal rolls back
        return codes

    def _target_changed(self) -> bool:
        """spec.go:32-49 `hasSpecChanged`."""
        st = self.status
        if not st.get("lastAppliedSpec"):
            return True
        new = compute_hash(self.template(self.target))
        if st.get("lastPromotedSpec") == new:
            return False
        return bool(st.get("lastAppliedSpec") != new)

    def tick(self) -> str:
        """One `advanceCanary` pass; returns the phase after it."""
        phase = self.phase
        # shouldAdvance (scheduler.go:852-884)
        if phase not in ("Progressing", "Waiting", "WaitingPromotion", "Promoting", "Finalising"):
            if phase == "Failed":
                self.status["lastAppliedSpec"] = compute_hash(self.template(self.target))
            if not self._target_changed():
                return self.phase
        # checkCanaryStatus (scheduler.go:886-933)
        if phase not in ("Progressing", "WaitingPromotion", "Promoting", "Finalising"):
            codes = self._call("confirm-rollout", phase)
            if any(c > 202 for c in codes):
                if phase != "Waiting":
                    self.status["phase"] = "Waiting"
                    self.events.append("Halt advancement waiting for approval")
                return self.phase  # returns before the rollback hooks
            self.events.append("New revision detected! Scaling up")
            self._scale(self.target, 1)
            self._sync_status("Progressing")
            return self.phase
        # hasCanaryRevisionChanged (scheduler.go:935-946)
        if phase in ("Progressing", "WaitingPromotion") and self._target_changed():
            self.events.append("New revision detected! Restarting analysis")
            self._scale(self.target, 1)
            self._sync_status("Progressing")
            return self.phase
        # rollback hooks (scheduler.go:368-377)
        rolls_back = phase in ("Progressing", "Waiting", "WaitingPromotion") and any(
            c <= 202 for c in self._call("rollback", phase)
        )
        if rolls_back:
            self.events.append("Rolling back: manual webhook invoked")
            self._scale(self.target, 0)
            self._sync_status("Failed")
            return self.phase
        if phase == "Promoting":
            self.status["phase"] = "Finalising"
            return self.phase
        if phase == "Finalising":
            self._scale(self.target, 0)
            self.status["phase"] = "Succeeded"
            # status.go:169-172: Succeeded records the promoted spec
            self.status["lastPromotedSpec"] = self.status["lastAppliedSpec"]
            self.events.append("Promotion completed!")
            return self.phase
        # runCanary (scheduler.go:565-636)
        weight = int(self.status.get("canaryWeight", 0))
        if weight < self.max_weight:
            self.status["canaryWeight"] = min(weight + self.step_weight, self.max_weight)
            return self.phase
        codes = self._call("confirm-promotion", "Progressing")
        if any(c > 202 for c in codes):
            if phase != "WaitingPromotion":
                self.status["phase"] = "WaitingPromotion"
                self.events.append("Halt advancement waiting for promotion approval")
            return self.phase
        primary = f"{self.target}-primary"
        obj = self.store.get(DEPLOYMENTS, self.namespace, primary)
        assert obj is not None
        obj["spec"]["template"]["spec"] = copy.deepcopy(self.template(self.target)["spec"])
        self._pods(primary, 2)
        self.status["phase"] = "Promoting"
        return self.phase

    def run(self, ticks: int) -> list[str]:
        return [self.tick() for _ in range(ticks)]
