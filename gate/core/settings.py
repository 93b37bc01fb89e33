"""Typed settings, read from GATE_* environment variables (and nothing at import time)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATE_", extra="ignore")

    data_dir: Path = Field(
        default=Path(".gate"),
        description="Where the embedded default keeps its SQLite file, reports and engine logs.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; unset means a SQLite file under data_dir.",
    )
    inventory: Path | None = Field(
        default=None,
        description="GPU inventory YAML; unset means the embedded local example inventory.",
    )
    lease_ttl_s: float = Field(default=600.0, gt=0, description="Reservation lease lifetime.")

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'gate.db').resolve()}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
