"""`gate worker`: a Celery worker process running gate tasks (placeholder)."""

from __future__ import annotations

from gate.core.settings import Settings


def run_worker(settings: Settings, concurrency: int = 1) -> int:
    raise NotImplementedError
