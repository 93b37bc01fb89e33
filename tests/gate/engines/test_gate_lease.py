"""The gate's Lease (gate/engines/gate_lease.py) through the real official client against the
stateful fake API server: renewed while held, its loss noticed, a retried gate's Lease adopted."""

from __future__ import annotations

import asyncio
import datetime as dt

from k8s_fake import FakeKubernetes, store_of

from gate.engines.gate_lease import GateLease
from gate.engines.manifests import render_lease

NS = "llm-gate"
GATE_ID = "5a1b2c3d4e5f60718293a4b5c6d7e8f9"
LEASES = "coordination.k8s.io/leases"


def test_gate_lease_is_renewed_and_loss_is_noticed(fake: FakeKubernetes) -> None:
    store = store_of(fake)
    lease = GateLease(fake.api_client(), namespace=NS, gate_id=GATE_ID, renew_every_s=0.01)

    async def go() -> None:
        uid = await lease.acquire()
        obj = store.get(LEASES, NS, lease.name)
        assert obj is not None and obj["metadata"]["uid"] == uid
        assert obj["spec"]["holderIdentity"] == f"llm-deploy-gate/{GATE_ID}"
        for _ in range(300):
            if len(fake.sent("PATCH")) >= 2:
                break
            await asyncio.sleep(0.01)
        patch = fake.sent("PATCH")[-1]
        assert set(patch.body) == {"spec"} and "renewTime" in patch.body["spec"]
        store.remove(LEASES, NS, lease.name)  # a reaper decided this gate was dead
        for _ in range(300):
            if lease.lost:
                break
            await asyncio.sleep(0.01)
        assert lease.lost is not None and "was deleted" in lease.lost
        await lease.release()

    asyncio.run(go())


def test_gate_lease_adopts_the_lease_of_the_same_gate(fake: FakeKubernetes) -> None:
    """A retried gate finds its own Lease (409 AlreadyExists) and owns its objects by it."""
    store = store_of(fake)
    now = dt.datetime.now(dt.UTC)
    existing = store.create(
        LEASES, render_lease(namespace=NS, gate_id=GATE_ID, holder="x", duration_s=60, now=now)
    )
    lease = GateLease(fake.api_client(), namespace=NS, gate_id=GATE_ID)

    async def go() -> None:
        assert await lease.acquire() == existing["metadata"]["uid"]
        await lease.release()

    asyncio.run(go())
    assert store.get(LEASES, NS, lease.name) is None
