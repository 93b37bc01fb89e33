"""All ORM models, importable from one place so Alembic sees them."""

from gate.models.base import Base
from gate.models.gates import CheckResult, GatePhase, GateRun, SampleSet
from gate.models.reservations import GpuLease, InventoryLock, Reservation
from gate.models.service import AlertDelivery, ApiToken, WebhookDelivery, WebSession

__all__ = [
    "AlertDelivery",
    "ApiToken",
    "Base",
    "CheckResult",
    "GatePhase",
    "GateRun",
    "GpuLease",
    "InventoryLock",
    "Reservation",
    "SampleSet",
    "WebSession",
    "WebhookDelivery",
]
