"""The Kubernetes API as the launcher uses it: create and delete its objects, read pods and
their logs, renew a Lease; the typed core, coordination and custom-object APIs of the official
client behind one small synchronous surface, every call bounded by a timeout (run it in a
thread from async code). A delete is Background propagation and a 404 is "already gone".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gate.engines.manifests import (
    CD_GROUP,
    CD_PLURAL,
    CD_VERSION,
    CONTAINER,
    LWS_GROUP,
    LWS_PLURAL,
    LWS_VERSION,
    Manifest,
    micro_time,
)
from gate.reservations.kubernetes import transient_errors

CUSTOM_KINDS = {
    "LeaderWorkerSet": (LWS_GROUP, LWS_VERSION, LWS_PLURAL),
    "ComputeDomain": (CD_GROUP, CD_VERSION, CD_PLURAL),
}
# What a poll or a delete can meet besides an API answer: a dropped connection, a timeout.
TRANSIENT = transient_errors()


@dataclass(frozen=True, slots=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def object_ref(manifest: Manifest) -> ObjectRef:
    meta = manifest["metadata"]
    return ObjectRef(str(manifest["kind"]), str(meta["namespace"]), str(meta["name"]))


class KubeApi:
    """The three typed APIs behind one small surface; every call is synchronous (run it in a
    thread from async code) and bounded by `timeout_s`."""

    def __init__(self, api_client: client.ApiClient, timeout_s: float = 10.0) -> None:
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout_s = timeout_s

    def create(self, manifest: Manifest) -> str:
        """Create one object; returns its uid."""
        ref, t = object_ref(manifest), self.timeout_s
        if ref.kind == "Pod":
            pod = client.V1Pod.from_dict(manifest)
            assert pod is not None
            return _uid(self.core.create_namespaced_pod(ref.namespace, pod, _request_timeout=t))
        if ref.kind == "Service":
            svc = client.V1Service.from_dict(manifest)
            assert svc is not None
            made = self.core.create_namespaced_service(ref.namespace, svc, _request_timeout=t)
            return _uid(made)
        if ref.kind == "Lease":
            lease = client.V1Lease.from_dict(manifest)
            assert lease is not None
            made_lease = self.coordination.create_namespaced_lease(
                ref.namespace, lease, _request_timeout=t
            )
            return _uid(made_lease)
        group, version, plural = CUSTOM_KINDS[ref.kind]
        obj = self.custom.create_namespaced_custom_object(
            group, version, ref.namespace, plural, manifest, _request_timeout=t
        )
        meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
        return str(meta.get("uid", ""))

    def delete(self, ref: ObjectRef, timeout_s: float | None = None) -> bool:
        """Delete with Background propagation; False when it was already gone."""
        t = timeout_s or self.timeout_s
        opts = client.V1DeleteOptions(propagation_policy="Background")
        try:
            if ref.kind == "Pod":
                self.core.delete_namespaced_pod(
                    ref.name, ref.namespace, body=opts, _request_timeout=t
                )
            elif ref.kind == "Service":
                self.core.delete_namespaced_service(
                    ref.name, ref.namespace, body=opts, _request_timeout=t
                )
            elif ref.kind == "Lease":
                self.coordination.delete_namespaced_lease(
                    ref.name, ref.namespace, body=opts, _request_timeout=t
                )
            else:
                group, version, plural = CUSTOM_KINDS[ref.kind]
                self.custom.delete_namespaced_custom_object(
                    group, version, ref.namespace, plural, ref.name, body=opts, _request_timeout=t
                )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def lease_uid(self, namespace: str, name: str) -> str:
        return _uid(
            self.coordination.read_namespaced_lease(
                name, namespace, _request_timeout=self.timeout_s
            )
        )

    def renew_lease(self, namespace: str, name: str, at: datetime) -> None:
        body = {"spec": {"renewTime": micro_time(at)}}
        self.coordination.patch_namespaced_lease(
            name, namespace, body, _request_timeout=self.timeout_s
        )

    def list_pods(self, namespace: str, selector: str) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(
            namespace, label_selector=selector, _request_timeout=self.timeout_s
        )
        return list(pods.items)

    def pod_log(
        self, namespace: str, pod: str, lines: int, *, previous: bool = False, timeout_s: float = 0
    ) -> list[str]:
        text = self.core.read_namespaced_pod_log(
            pod,
            namespace,
            container=CONTAINER,
            tail_lines=lines,
            previous=previous,
            _request_timeout=timeout_s or self.timeout_s,
        )
        return str(text or "").splitlines()[-lines:]


def _uid(obj: Any) -> str:
    meta = getattr(obj, "metadata", None)
    return str(getattr(meta, "uid", None) or "")
