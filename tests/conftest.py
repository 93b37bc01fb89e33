"""Shared fixtures: a migrated database per test, and a guard that no engine outlives a test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import make_engine, make_sessionmaker, upgrade


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gate.db'}"


@pytest.fixture
def factory(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    upgrade(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line contains `marker` (a unique --tag given to sim engines)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if marker in cmd and "State:\tZ" not in status:
            found.append(int(entry.name))
    return found


@pytest.fixture
def find_processes() -> object:
    return processes_with
