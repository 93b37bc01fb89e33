"""`gate.run` is registered once per Celery app, on that app alone.

`gate worker` builds two Celery apps in one process: its own (`make_celery(settings,
factory)`, the one it runs) and its reaper's `CeleryDispatcher` (to re-queue and read the
queue). A shared task (Celery's default) is also registered on every app finalized after it,
so each app met two `gate.run` callables and every worker start printed Celery's
`DuplicateTaskNameWarning`, whose consequence is that one app's calls reach the other app's
callable."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from celery.exceptions import DuplicateTaskNameWarning

from gate.core.settings import Settings
from gate.worker.celery_app import TASK_NAME, make_celery
from gate.worker.celery_dispatch import CeleryDispatcher


def _settings(tmp_path: Path) -> Settings:
    # Nothing here connects: building and finalizing Celery apps reads no broker.
    return Settings(
        broker_url="redis://127.0.0.1:6379/0",
        database_url=f"sqlite:///{tmp_path / 'gate.db'}",
        data_dir=tmp_path / "data",
    )


def test_the_apps_gate_worker_builds_register_gate_run_without_a_warning(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    gc.collect()  # what earlier tests left for the collector goes now, not inside the window
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = make_celery(settings, None)  # as run_worker: the worker's app first
        dispatcher = CeleryDispatcher(settings)  # then the reaper's re-queueing dispatcher
        api = CeleryDispatcher(settings)  # and one more, as an API in the same process
        try:
            # `app.Worker(...)` finalizes the worker's app; the dispatchers' apps finalize
            # when they first send. Both orders, so neither app sees the other's task.
            tasks = [a.tasks[TASK_NAME] for a in (dispatcher.app, app, api.app)]
            stranger = Celery("stranger", set_as_current=False)
            assert TASK_NAME not in stranger.tasks  # not registered on apps made later
            stranger.close()
        finally:
            dispatcher.close()
            api.close()
            app.close()
    duplicates = [w for w in caught if issubclass(w.category, DuplicateTaskNameWarning)]
    assert duplicates == [], [str(w.message) for w in duplicates]
    # nor any other warning: the task's deprecated `queue` attribute warned as well. A
    # ResourceWarning is the garbage collector finding what an earlier test in this worker
    # left open (CI: a psycopg connection collected inside this window), not these apps'.
    assert [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)] == []
    runs: list[Callable[..., Any]] = [t.run.__func__ for t in tasks]
    assert len({id(f) for f in runs}) == 3, "each app must run its own gate.run callable"
    assert [t._get_app() for t in tasks] == [dispatcher.app, app, api.app]


def test_gate_worker_starts_without_a_duplicate_task_warning(start_worker: Any) -> None:
    """The real `gate worker` (its log is its stdout and stderr) prints no Celery task
    warning from start to a warm shutdown."""
    w = start_worker()
    assert w.stop() == 0
    log = w.log()
    assert f"{w.name} ready" in log
    assert "DuplicateTaskNameWarning" not in log, log
    assert "already registered" not in log, log
    assert "CDeprecationWarning" not in log, log
