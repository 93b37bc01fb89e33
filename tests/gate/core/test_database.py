from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect

from gate.core.database import make_engine, migrations_dir, upgrade


def test_migrations_build_the_schema_and_downgrade(tmp_path: Path) -> None:
    from alembic import command

    from gate.core.database import alembic_config

    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    upgrade(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"gates", "gate_phases", "sample_sets", "checks", "reservations", "gpu_leases"} <= tables
    assert "alembic_version" in tables
    cfg = alembic_config(str(engine.url))
    command.downgrade(cfg, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(engine)  # and back up again
    assert "gates" in inspect(engine).get_table_names()


def test_models_match_migrations(tmp_path: Path) -> None:
    """The ORM models and the migrated schema agree (no pending autogenerate diff)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from gate.models import Base

    engine = make_engine(f"sqlite:///{tmp_path / 'y.db'}")
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_migrations_dir_found() -> None:
    assert (migrations_dir() / "env.py").is_file()
