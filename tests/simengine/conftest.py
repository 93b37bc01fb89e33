"""Fixtures that run real sim processes on real sockets.

Every process is killed in a finaliser, whatever the test did to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from simengine.launch import SimPool

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[SimPool]:
    with SimPool(workdir=tmp_path, cwd=REPO_ROOT) as pool:
        yield pool


@pytest.fixture(scope="module")
def module_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimPool]:
    with SimPool(workdir=tmp_path_factory.mktemp("sim"), cwd=REPO_ROOT) as pool:
        yield pool


@pytest.fixture
def tag(find_processes: Callable[[str], list[int]]) -> Iterator[str]:
    """A tag for this test's sim processes; after the test, none may be left (as tests/gate's)."""
    t = uuid.uuid4().hex
    yield t
    assert find_processes(t) == [], "a sim process outlived its test"
