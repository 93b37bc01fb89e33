"""The Lease that owns every object of one gate (shared by its engines), renewed while held.

The gate's objects carry it as their ownerReference, so when a gate dies without teardown its
Lease stops being renewed, `reap_expired_leases` (gate/reservations/kubernetes.py) deletes it
and the garbage collector removes the rest; a live gate's last engine deletes it on release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gate.engines.kube_api import TRANSIENT, KubeApi, ObjectRef
from gate.engines.manifests import MANAGER, lease_name, render_lease
from gate.reservations.kubernetes import api_reason

log = logging.getLogger(__name__)


async def cancel_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task (a lease renewer, a pod watcher) and wait until it has ended."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class GateLease:
    """The Lease that owns every object of one gate, shared by its engines.

    The first `acquire` creates it (or adopts one of the same name: a retry of the same gate)
    and starts renewing it every `renew_every_s`; each engine's `release` counts down, and the
    last one deletes it with Background propagation, which lets the garbage collector remove
    whatever the explicit deletes missed. renewTime is wall-clock time by the Lease's
    definition: it is compared with other machines' clocks by `reap_expired_leases`.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str,
        gate_id: str,
        holder: str | None = None,
        duration_s: int = 60,
        renew_every_s: float | None = None,
        name: str | None = None,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.api = KubeApi(api_client, request_timeout_s)
        self.namespace = namespace
        self.gate_id = gate_id
        self.name = name or lease_name(gate_id)
        self.holder = holder or f"{MANAGER}/{gate_id}"
        self.duration_s = duration_s
        self.renew_every_s = renew_every_s if renew_every_s is not None else duration_s / 3
        self.uid: str | None = None
        self.lost: str | None = None  # why the Lease is gone while held, if it is
        self._holders = 0
        self._attempted = False
        self._lock = asyncio.Lock()
        self._renewer: asyncio.Task[None] | None = None

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("Lease", self.namespace, self.name)

    async def acquire(self) -> str:
        """The Lease's uid, for ownerReferences. Counts a holder even when it fails, so the
        caller's `release` (always called) still deletes a Lease created before the failure."""
        self._holders += 1
        async with self._lock:
            if self.uid is None:
                self._attempted = True
                manifest = render_lease(
                    namespace=self.namespace,
                    gate_id=self.gate_id,
                    holder=self.holder,
                    duration_s=self.duration_s,
                    now=datetime.now(UTC),
                    name=self.name,
                )
                try:
                    uid = await asyncio.to_thread(self.api.create, manifest)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    uid = await asyncio.to_thread(self.api.lease_uid, self.namespace, self.name)
                self.uid = uid
                self.lost = None
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.create_task(self._renew())
            return self.uid

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                await asyncio.to_thread(
                    self.api.renew_lease, self.namespace, self.name, datetime.now(UTC)
                )
            except ApiException as exc:
                if exc.status == 404:
                    self.lost = f"the gate's Lease {self.namespace}/{self.name} was deleted"
                    return
                log.warning("renewing Lease %s failed: %s", self.name, api_reason(exc))
            except TRANSIENT as exc:
                log.warning("renewing Lease %s failed: %s", self.name, api_reason(exc))

    async def _stop_renewing(self) -> None:
        task, self._renewer = self._renewer, None
        await cancel_task(task)

    async def release(self) -> None:
        self._holders = max(0, self._holders - 1)
        if self._holders:
            return
        await self._stop_renewing()
        if self._attempted:
            await asyncio.to_thread(self.api.delete, self.ref)
            self._attempted = False
            self.uid = None

    def kill_now(self) -> None:
        """Synchronous last resort: delete the Lease whoever still holds it."""
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        if self._attempted:
            with contextlib.suppress(*TRANSIENT):
                self.api.delete(self.ref, timeout_s=5)
            self._attempted = False
            self.uid = None
        self._holders = 0
