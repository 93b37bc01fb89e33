"""The per-token cap on active gates holds under concurrency, on SQLite and on a real
PostgreSQL: the count and the insert are one transaction under the owner's lock
(`service.create_gate`). Before, 40 concurrent creates from one token left 27-40 active gates
against a cap of 20 (measured through a real `gate serve`, both databases)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import make_engine, make_sessionmaker, upgrade
from gate.core.errors import TooManyGates
from gate.service import service
from gate.spec import GateSpec, parse_spec

CAP = 20


@pytest.fixture(params=["sqlite", "postgresql"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """One database, many connections (the pool hands each thread its own)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'quota.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    engine = make_engine(url)
    upgrade(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


def spec(seed: int) -> GateSpec:
    return parse_spec(
        {
            "name": f"q{seed}",
            "model": "m",
            "reference": {"preset": "sim"},
            "candidate": {"preset": "sim", "args": ["--seed", str(seed)]},
            "scenarios": [{"name": "a", "rate": 5, "requests": 10}],
        }
    )


def race(factory: sessionmaker[Session], calls: list[tuple[str, int, str | None]]) -> list[str]:
    """Every call (owner, seed, idempotency key) at once, released by one barrier; what each
    got: `created`, `reused` or `refused`."""
    specs = [spec(seed) for _, seed, _ in calls]  # parsed before the race, not inside it
    barrier = threading.Barrier(len(calls))

    def one(i: int) -> str:
        owner, _, key = calls[i]
        barrier.wait()
        try:
            _, created = service.create_gate(
                factory, specs[i], owner=owner, max_active=CAP, idempotency_key=key
            )
        except TooManyGates:
            return "refused"
        return "created" if created else "reused"

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(one, range(len(calls))))


def test_concurrent_creates_from_one_token_stop_at_the_cap(
    shared: sessionmaker[Session],
) -> None:
    """40 creates from one token and 10 from another, all at once: the first gets exactly its
    cap, the second all of its (under the cap, never refused for the first one's load)."""
    calls = [("token:greedy", i, None) for i in range(40)]
    calls += [("token:other", 100 + i, None) for i in range(10)]
    got = race(shared, calls)
    greedy, other = got[:40], got[40:]
    assert greedy.count("created") == CAP and greedy.count("refused") == 40 - CAP, greedy
    assert other == ["created"] * 10
    assert service.active_gates(shared, "token:greedy") == CAP
    assert service.active_gates(shared, "token:other") == 10


def test_concurrent_ensures_at_the_cap_reuse_the_gate_instead_of_refusing(
    shared: sessionmaker[Session],
) -> None:
    """A token one gate under its cap, polling `ensure` with one key from many threads: one
    gate is made and every other call gets it back (none is told it has too many gates)."""
    race(shared, [("token:argo", i, None) for i in range(CAP - 1)])
    got = race(shared, [("token:argo", 999, "same-key") for _ in range(16)])
    assert got.count("created") == 1 and got.count("reused") == 15, got
    assert service.active_gates(shared, "token:argo") == CAP
