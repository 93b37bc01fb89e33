"""The rule for tests that need a service (PostgreSQL, Redis, Chromium): locally a missing one
skips them; in CI (CI=true) it fails them, since .ci/run must have installed and started it."""

from __future__ import annotations

import os

import pytest


def service_missing(what: str, why: str) -> None:
    msg = f"{what} is not available ({why}); .ci/run installs and starts it"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg)
    pytest.skip(msg)
