"""The base of every model of the verdict document: unknown keys refused (a typo in a builder
fails a test instead of reaching users), and a JSON form with only the fields that were given
(document.py's docstring: a stored document read back and written again gives the same JSON)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__: list[str] = []


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values, only the fields that were given (see the module docstring)."""
        return self.model_dump(mode="json", exclude_unset=True)
