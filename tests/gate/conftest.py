"""Whole gates on real sim engine processes (gate/runs, gate/verdict): every engine must die with
its gate."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def tag(find_processes: Callable[[str], list[int]]) -> Iterator[str]:
    """A tag for this test's engine processes; after the test, none may be left."""
    t = uuid.uuid4().hex
    yield t
    assert find_processes(t) == [], "an engine process outlived its gate"
