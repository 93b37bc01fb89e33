"""Which gates share a history, and which are A/A, decided from the spec alone (pure).

A spec's identity is its name, model and shape: gates of one identity ran the same load on the
same kind of hardware, so their references' own figures are comparable across time (a change
of scenarios under the same name is a new history only when it changes the name; the history
page shows each gate's scenarios). An A/A gate compares an engine with itself: both engines are
specified alike (the same argv or preset and arguments, image, URL, environment; the `kind:`
spelling aside). It should continue; how often A/A gates hold is the gate's own false alarm
rate on this test bed, which the history page and `gate_aa_gates` show.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gate.spec.engines import EngineSpec
from gate.spec.gate_spec import GateSpec

IDENTITY_CHARS = 16  # hex digits of a SHA-256: unique enough within one service's gates


def identity_parts(spec: GateSpec) -> dict[str, Any]:
    """What an identity is made of, as JSON values."""
    return {
        "name": spec.name,
        "model": spec.model,
        "shape": spec.shape.model_dump(mode="json", exclude_unset=True),
    }


def spec_identity(spec: GateSpec) -> str:
    """The identity's key: a digest of `identity_parts`, stable across processes."""
    text = json.dumps(identity_parts(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:IDENTITY_CHARS]


def _engine_form(es: EngineSpec) -> dict[str, Any]:
    form = es.model_dump(mode="json", exclude_unset=True)
    form.pop("kind", None)
    return form


def is_aa(spec: GateSpec) -> bool:
    """Both engines specified alike (module docstring)."""
    return _engine_form(spec.reference) == _engine_form(spec.candidate)
