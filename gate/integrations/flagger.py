"""Flagger's canary hooks, answered as Flagger's scheduler needs them.

What Flagger does, from its source (fluxcd/flagger, pkg/controller/scheduler.go,
scheduler_hooks.go, webhook.go; pkg/canary/status.go, spec.go, deployment_controller.go):

- Every webhook payload carries `checksum = canaryChecksum(canary)`, a hash of
  `Status.TrackedConfigs` and `Status.LastAppliedSpec` (webhook.go `canaryChecksum`).
  `LastAppliedSpec` is written by `SyncStatus`, which runs when the canary is initialised and
  when `confirm-rollout` passes and the canary starts `Progressing` (scheduler.go
  `checkCanaryStatus`), not when a new revision is detected. So every `confirm-rollout` call for
  a new revision carries the previous revision's checksum, and `confirm-promotion` / `rollback`
  calls of the same revision carry another one. The checksum names no revision the gate can
  use: the gate reads what is rolled out from the cluster instead.
- `confirm-rollout` that fails puts the canary in `Waiting` and `checkCanaryStatus` returns
  before `runRollbackHooks` is reached, so a refused canary is never rolled back by the
  rollback hook: it waits, and each `interval` Flagger asks `confirm-rollout` again (with the
  same old checksum) whatever revision the target now holds.
- The target workload is `spec.targetRef` (a Deployment or DaemonSet); the workload serving
  the known-good release is `<targetRef.name>-primary` (deployment_controller.go `Promote`).

So the gate of a canary is keyed by the canary and the pair of images it actually compares (the
target's pod template against the primary's): a new revision is a new gate whatever checksum
arrives, and the same revision asked again is the same gate. Only `confirm-rollout` starts a
gate; `confirm-promotion` and `rollback` read the gate of the revision the target holds now.

The cluster reads go through the official client; `hook_answer` is the pure decision.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import urllib3

from gate.core.errors import ClusterError, FieldProblem, SpecError
from gate.spec import image_repository

if TYPE_CHECKING:
    from kubernetes import client

log = logging.getLogger("gate.integrations")

HookType = Literal["confirm-rollout", "confirm-promotion", "rollback"]
WORKLOAD_KINDS = ("Deployment", "DaemonSet")  # Flagger's kinds with a pod template
CANARY_GROUP, CANARY_VERSION, CANARY_PLURAL = "flagger.app", "v1beta1", "canaries"
ANNOTATION_PREFIX = "llm-deploy-gate.io/"
CONNECT_S = 3.0  # one call's connect timeout, on a client without retries
HOOK_BUDGET_S = 8.0  # all the cluster calls of one hook (GATE_FLAGGER_BUDGET_S's default)
_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")


@dataclass(frozen=True)
class RolloutImages:
    """What a canary rolls out, as the cluster says: the images the pod templates name (the
    gate's identity for this revision) and, where running pods report them, the digests the
    gate runs (a tag can move; a digest cannot)."""

    namespace: str
    canary: str
    target: str  # "<Kind>/<name>" of spec.targetRef
    container: str
    candidate: str  # the target's pod template image
    reference: str  # the primary's pod template image
    candidate_digest: str | None = None  # `repository@sha256:…` from the target's pods
    reference_digest: str | None = None  # from the primary's pods

    @property
    def candidate_run(self) -> str:
        return self.candidate_digest or self.candidate

    @property
    def reference_run(self) -> str:
        return self.reference_digest or self.reference

    @property
    def same_image(self) -> bool:
        """The target's template names the primary's image again (a revert). Only the names
        the templates give count: a digest read from pods cannot make two templates equal."""
        return self.candidate == self.reference


def pinned(image: str, image_id: str) -> str | None:
    """The image pinned by the digest a pod's `status.containerStatuses[].imageID` reports,
    in the repository the template names: `vllm/vllm-openai:v0.11.0` with `docker.io/vllm/
    vllm-openai@sha256:ab…` -> `vllm/vllm-openai@sha256:ab…`. None when the runtime reports no
    registry digest (a bare `sha256:` image id is the local image, not a registry's)."""
    m = _DIGEST.search(image_id.strip())
    if m is None:
        return None
    return f"{image_repository(image)}@{m.group(1)}"


def hook_answer(
    hook: HookType,
    verdict: str | None,
    *,
    has_gate: bool,
    same_image: bool = False,
    progressing: bool = False,
) -> tuple[int, str | None]:
    """Flagger's status code for a hook, given the gate of the revision (None while it runs):
    Flagger reads any status above 202 as "no" (webhook.go `callWebhook`). Returns the code and,
    where the gate's own reason does not say it, why.

    - confirm-rollout: yes only on continue (a revert to the primary's image: yes, nothing new);
    - confirm-promotion: yes only on continue; no gate for this revision: no (it was never gated,
      e.g. a revision that changed during the analysis, which Flagger does not confirm again);
    - rollback: yes on a decided hold of this revision's gate, and on a revision that is
      progressing (`progressing`: the cluster says so and Flagger's phase is Progressing or
      WaitingPromotion) without a gate: Flagger restarts the analysis of a revision that changed
      after confirm-rollout passed without asking confirm-rollout again (scheduler.go:327-350),
      so that revision takes canary traffic ungated, and rolling it back is the safe answer."""
    if same_image and hook != "rollback":
        return 200, "the target holds the primary's image again: nothing new to gate"
    if same_image:
        return 403, "the target holds the primary's image again: nothing to roll back"
    if not has_gate:
        if hook == "rollback" and progressing:
            return 200, (
                "this revision was never gated (it changed after confirm-rollout passed): roll "
                "it back; deploy it again to gate it"
            )
        if hook == "rollback":
            return 403, "no gate for this revision: no rollback"
        return 403, (
            "no gate for this revision: only confirm-rollout starts one (the revision changed "
            "after confirm-rollout passed, or the Canary has no confirm-rollout hook to the gate)"
        )
    if hook == "rollback":
        return (200, None) if verdict == "hold" else (403, None)
    return (200, None) if verdict == "continue" else (403, None)


# -- the cluster ---------------------------------------------------------------------------------


def timeout_until(deadline: float, what: str) -> tuple[float, float]:
    """One call's (connect, read) timeout: what is left before `deadline` (the connect at most
    CONNECT_S); a ClusterError when nothing is."""
    left = deadline - time.monotonic()
    if left < 0.1:
        raise ClusterError(f"{what}: the cluster took all of the hook's time")
    return min(CONNECT_S, left), left


def read_rollout(
    api_client: client.ApiClient,
    namespace: str,
    name: str,
    container: str | None,
    *,
    deadline: float | None = None,
) -> RolloutImages:
    """The Canary `namespace/name`, its target and its primary, read with the official client;
    a ClusterError naming the object on anything the gate cannot use. The reads end by
    `deadline` (time.monotonic(); default HOOK_BUDGET_S from now), so a slow API server is a
    ClusterError the hook answers with, not a hook Flagger gave up on."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    ends = deadline if deadline is not None else time.monotonic() + HOOK_BUDGET_S

    def get(what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args, _request_timeout=timeout_until(ends, f"reading {what}"))
        except ApiException as exc:
            reason = exc.reason or ""
            if exc.status == 404:
                raise ClusterError(f"{what} not found in the cluster") from None
            if exc.status in (401, 403):
                raise ClusterError(
                    f"the gate may not read {what} ({exc.status} {reason}): give its service "
                    "account get on canaries.flagger.app and the target, list on pods"
                ) from None
            raise ClusterError(f"reading {what}: {exc.status} {reason}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            # urllib3's MaxRetryError (refused, unreachable) is no OSError
            raise ClusterError(f"reading {what}: {type(exc).__name__}: {exc}") from None

    canary = get(
        f"Canary {namespace}/{name}",
        k.CustomObjectsApi(api_client).get_namespaced_custom_object,
        CANARY_GROUP,
        CANARY_VERSION,
        namespace,
        CANARY_PLURAL,
        name,
    )
    ref = ((canary or {}).get("spec") or {}).get("targetRef") or {}
    kind, target = str(ref.get("kind") or ""), str(ref.get("name") or "")
    if kind not in WORKLOAD_KINDS or not target:
        raise ClusterError(
            f"Canary {namespace}/{name}: targetRef {kind or '(no kind)'}/{target or '(no name)'} "
            f"is not one the gate reads images from ({', '.join(WORKLOAD_KINDS)})"
        )
    apps = k.AppsV1Api(api_client)
    read = (
        apps.read_namespaced_deployment if kind == "Deployment" else apps.read_namespaced_daemon_set
    )
    primary_name = f"{target}-primary"
    workload = get(f"{kind} {namespace}/{target}", read, target, namespace)
    primary = get(
        f"{kind} {namespace}/{primary_name} (Flagger's primary)", read, primary_name, namespace
    )
    chosen = _container(workload, container, f"{kind} {namespace}/{target}")
    cand = _image(workload, chosen, f"{kind} {namespace}/{target}")
    ref_image = _image(primary, chosen, f"{kind} {namespace}/{primary_name}")
    core = k.CoreV1Api(api_client)
    return RolloutImages(
        namespace=namespace,
        canary=name,
        target=f"{kind}/{target}",
        container=chosen,
        candidate=cand,
        reference=ref_image,
        candidate_digest=_running_digest(core, workload, chosen, cand, get),
        reference_digest=_running_digest(core, primary, chosen, ref_image, get),
    )


def _container(workload: Any, wanted: str | None, what: str) -> str:
    names = [c.name for c in workload.spec.template.spec.containers or []]
    if wanted is not None:
        if wanted not in names:
            raise SpecError(
                [
                    FieldProblem(
                        "metadata.container",
                        f"{what} has no container {wanted!r} (its containers: {', '.join(names)})",
                    )
                ],
                "flagger",
            )
        return wanted
    if len(names) != 1:
        raise SpecError(
            [
                FieldProblem(
                    "metadata.container",
                    f"{what} has {len(names)} containers ({', '.join(names)}): name the engine's",
                )
            ],
            "flagger",
        )
    return str(names[0])


def _image(workload: Any, container: str, what: str) -> str:
    for c in workload.spec.template.spec.containers or []:
        if c.name == container and c.image:
            return str(c.image)
    raise ClusterError(f"{what} has no container {container!r} with an image")


def _running_digest(core: Any, workload: Any, container: str, image: str, get: Any) -> str | None:
    """The digest every running pod of the workload reports for the container, when they agree
    (pods of two ReplicaSets mid-update do not: then none, and the tag is run)."""
    if _DIGEST.search(image):
        return image  # the template already pins one
    labels = (workload.spec.selector.match_labels or {}) if workload.spec.selector else {}
    if not labels:
        return None
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    pods = get(
        f"pods of {workload.metadata.namespace}/{workload.metadata.name}",
        lambda **kw: core.list_namespaced_pod(
            workload.metadata.namespace, label_selector=selector, **kw
        ),
    )
    seen: set[str] = set()
    for pod in pods.items or []:
        status = pod.status
        if (
            status is None
            or status.phase != "Running"
            or pod.metadata.deletion_timestamp is not None
            or not _matches(pod.metadata.labels or {}, labels)
            or not _runs(pod, container, image)
        ):
            continue  # a pod of another template (mid-update, terminating) says nothing
        for cs in status.container_statuses or []:
            if cs.name == container and cs.image_id:
                got = pinned(image, cs.image_id)
                if got is not None:
                    seen.add(got)
    return seen.pop() if len(seen) == 1 else None


def _runs(pod: Any, container: str, image: str) -> bool:
    """The pod's own spec runs the template's image in the container."""
    for c in (pod.spec.containers or []) if pod.spec else []:
        if c.name == container:
            return bool(c.image == image)
    return False


def _matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in wanted.items())


def annotate(
    api_client: client.ApiClient,
    images: RolloutImages,
    values: Mapping[str, str],
    event: str,
    *,
    deadline: float | None = None,
) -> bool:
    """Make a held (or decided) rollout visible in `kubectl`: the gate's verdict, summary,
    reason and report on the Canary's annotations (`kubectl describe canary`), and a Warning
    Event on it for a hold. Only when the annotations differ, so polling writes once per
    verdict. Returns whether it wrote; a failure is logged, never an answer to Flagger (the hook
    still says no, and the next poll writes them). The calls end by `deadline`, like
    `read_rollout`'s."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    ends = deadline if deadline is not None else time.monotonic() + HOOK_BUDGET_S
    what = f"annotating Canary {images.namespace}/{images.canary}"

    custom = k.CustomObjectsApi(api_client)
    wanted = {ANNOTATION_PREFIX + key: value[:1000] for key, value in values.items()}
    try:
        canary: Any = custom.get_namespaced_custom_object(
            CANARY_GROUP,
            CANARY_VERSION,
            images.namespace,
            CANARY_PLURAL,
            images.canary,
            _request_timeout=timeout_until(ends, what),
        )
        meta = (canary if isinstance(canary, dict) else {}).get("metadata") or {}
        have = meta.get("annotations") or {}
        if all(have.get(key) == value for key, value in wanted.items()):
            return False
        custom.patch_namespaced_custom_object(
            CANARY_GROUP,
            CANARY_VERSION,
            images.namespace,
            CANARY_PLURAL,
            images.canary,
            {"metadata": {"annotations": wanted}},
            _request_timeout=timeout_until(ends, what),
        )
        if event:
            uid = meta.get("uid")
            now = datetime.now(UTC)
            k.CoreV1Api(api_client).create_namespaced_event(
                images.namespace,
                k.CoreV1Event(
                    metadata=k.V1ObjectMeta(generate_name=f"{images.canary}."),
                    involved_object=k.V1ObjectReference(
                        api_version=f"{CANARY_GROUP}/{CANARY_VERSION}",
                        kind="Canary",
                        name=images.canary,
                        namespace=images.namespace,
                        uid=uid,
                    ),
                    reason="DeployGateHold",
                    message=event[:1000],
                    type="Warning",
                    source=k.V1EventSource(component="llm-deploy-gate"),
                    count=1,
                    first_timestamp=now,
                    last_timestamp=now,
                ),
                _request_timeout=timeout_until(ends, what),
            )
    except (ApiException, ClusterError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        log.warning("could not annotate Canary %s/%s: %s", images.namespace, images.canary, exc)
        return False
    return True
