"""Database engines and sessions; the schema is made by the Alembic migrations, never create_all."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, literal, select, text
from sqlalchemy.orm import Session, sessionmaker

import gate


def make_engine(url: str) -> Engine:
    """An engine with the pragmas the embedded default needs for concurrent use."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not the driver, open transactions, so that they can be IMMEDIATE.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # Writers are serialised up front (they wait on busy_timeout) instead of failing
            # when a read transaction tries to become a write one after another writer won.
            # Read-only units of work (`reading`) take a plain snapshot and wait for nobody.
            readonly = conn.get_execution_options().get("gate_readonly", False)
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine
    # A server that does not answer costs a bounded wait, not the OS's TCP timeout: a gate's
    # heartbeat and lease renewal retry instead of hanging (gate/runs/journal.py).
    return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 5})


def migrations_dir() -> Path:
    """The Alembic scripts: packaged inside `gate` in a wheel, at the repo root in a checkout."""
    packaged = Path(gate.__file__).parent / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(gate.__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


# Alembic's command API swaps module-global proxies (`alembic.context`, `op`) in and out, so
# two migrations at once in one process (two gates starting on a worker's threads) break it.
_UPGRADE_LOCK = threading.Lock()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` by running the real migrations on this engine (one
    migration at a time per process)."""
    from alembic import command

    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with _UPGRADE_LOCK, engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def reading(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A read-only unit of work: on SQLite a deferred transaction (a WAL snapshot that never
    waits for writers); elsewhere an ordinary one, ended without a commit."""
    bind = factory.kw["bind"]
    session = Session(bind=bind.execution_options(gate_readonly=True), expire_on_commit=False)
    try:
        yield session
    finally:
        session.close()  # ends the transaction; loaded objects stay usable (not expired)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """The caller's unit of work: commit on success, roll back on any error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def db_now(session: Session) -> datetime:
    """The database's clock, now, inside the caller's transaction: what every expiry and
    heartbeat is written and compared with, so no two hosts' clocks are ever compared.

    PostgreSQL: `clock_timestamp()`, the time of this statement (not `now()`, which is the
    transaction's start and may be long past when a lock was waited for). SQLite: the database
    is a file on this host, so this host's clock, read after the transaction's first statement
    (its BEGIN IMMEDIATE waits for the write lock), i.e. at the moment the write may happen."""
    if session.get_bind().dialect.name == "postgresql":
        at: datetime | None = session.scalar(select(func.clock_timestamp()))
        assert at is not None
        return at if at.tzinfo else at.replace(tzinfo=UTC)
    session.execute(select(literal(1)))
    return datetime.now(UTC)


MIGRATION_LOCK = 0x6A7E_0001  # pg_advisory_lock key: one process migrates at a time


def open_migrated(url: str) -> sessionmaker[Session]:
    """A sessionmaker on a schema brought to head. On PostgreSQL the migration runs under an
    advisory lock, so an API and workers starting together against a fresh database do not
    race to create the same tables (the later ones find the schema at head)."""
    engine = make_engine(url)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
            try:
                upgrade(engine)
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
                conn.commit()
    else:
        upgrade(engine)
    return make_sessionmaker(engine)
