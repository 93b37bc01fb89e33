"""Celery application: gate runs as tasks on `gate worker` processes (placeholder)."""

from __future__ import annotations

from typing import Any

from gate.core.settings import Settings


def make_celery(settings: Settings) -> Any:
    from celery import Celery

    return Celery("gate", broker=settings.broker_url)
