"""Shared fixtures: a migrated database per test, and a guard that no engine outlives a test."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from receiver import Receiver
from services import service_missing
from sqlalchemy.orm import Session, sessionmaker

from gate.core.database import make_engine, make_sessionmaker, upgrade
from gate.core.threads import one_blas_thread

# The fast tier (`make check`): tests of the pure cores (no process, socket, database server or
# browser), by where they live. A test there that runs many simulated gates is marked
# `simulation` and left to `make test`.
CORE_PATHS = (
    "gate/analysis/",
    "gate/verdict/",
    "gate/spec/",
    "gate/test_spec",
    "test_architecture.py",
    "docs/test_architecture_doc.py",
    "test_docs_settings.py",
)
NOT_CORE = ("slow", "serial", "timed_gate", "vllm", "simulation")


def pytest_configure(config: pytest.Config) -> None:
    """Each test process (every xdist worker) judges with one BLAS thread, as `gate` does
    (gate/core/threads.py): beside the real-vLLM tests, OpenBLAS's spinning threads made a 0.6 s
    bootstrap test take 71 s."""
    one_blas_thread()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_core(items)
    _unique_nodeids(items)
    _group_module_fixtures(config, items)


def _mark_core(items: list[pytest.Item]) -> None:
    """Marks the fast tier's tests `core` (CORE_PATHS)."""
    root = Path(__file__).parent
    for item in items:
        try:
            where = item.path.relative_to(root).as_posix()
        except ValueError:
            continue
        if where.startswith(CORE_PATHS) and not any(item.get_closest_marker(m) for m in NOT_CORE):
            item.add_marker(pytest.mark.core)


def _unique_nodeids(items: list[pytest.Item]) -> None:
    """Every item its own node id. Schemathesis 4 gives each API operation's test the function's
    id (its name alone says the operation: `test_x[GET /v1/gates]`), and pytest-xdist's
    loadgroup scheduler finds items by id (`list.index`): 17 operations ran as one, silently.
    An item that shares its id is renamed after its name; an id still shared is an error."""
    seen = Counter(item.nodeid for item in items)
    for item in items:
        if seen[item.nodeid] > 1 and not item.nodeid.endswith(item.name):
            renamed = f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}"
            if hasattr(item, "_id"):  # pytest 9: a structured NodeId
                from _pytest.nodeid import coerce_node_id

                item._id = coerce_node_id(renamed)
            else:  # pytest 8: the string
                item._nodeid = renamed  # type: ignore[attr-defined]
    shared = [nodeid for nodeid, n in Counter(i.nodeid for i in items).items() if n > 1]
    if shared:
        raise pytest.UsageError(f"tests that share a node id (xdist would run one): {shared[:5]}")


def _group_module_fixtures(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a parallel run (`make test`: pytest-xdist with --dist loadgroup) the tests of a module
    that share a module-scoped fixture (a browser and the gate it shows, a pool of sim
    processes) go to one worker, so the fixture is set up once rather than once per worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return  # `-p no:xdist`: no workers, and no xdist_group marker to set
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(d and d[-1].scope == "module" for d in info.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gate.db'}"


@pytest.fixture
def factory(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    upgrade(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


def processes_with(marker: str, keepers: bool = False) -> list[int]:
    """PIDs whose command line contains `marker` (a unique --tag given to sim engines): the
    engines' own processes, and with `keepers` also their keepers (gate/engines/keeper.py,
    whose command line holds the engine's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if marker in cmd and "State:\tZ" not in status and (keepers or "keeper.py" not in cmd):
            found.append(int(entry.name))
    return found


@pytest.fixture
def find_processes() -> object:
    return processes_with


POSTGRES_ADMIN_URL = os.environ.get(
    "GATE_TEST_POSTGRES_URL", "postgresql+psycopg://gate:gate@127.0.0.1:5432/gate"
)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"gate_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # any failure to reach the server means "absent"
        admin.dispose()
        service_missing("PostgreSQL", f"{type(exc).__name__}: {exc}".splitlines()[0])
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP server standing in for a commit-status API."""
    r = Receiver()
    yield r
    r.close()
