"""The outputs of mirrored requests: compared across the engines, kept in the verdict, and
read back from it to re-judge."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from gate.analysis.outputs import MirroredOutputs, Output, OutputExample, compare_outputs
from gate.core.vocabulary import ROLES
from gate.verdict.document import OutputExampleDoc, OutputsDoc
from loadgen.records import RequestRecord


def _output(rec: RequestRecord) -> Output:
    return Output(text=rec.text, tokens=rec.output_tokens, token_ids=rec.token_ids)


def mirrored_outputs(
    name: str,
    records: Mapping[str, Sequence[RequestRecord]],
    early_tokens: int,
    not_mirrored: AbstractSet[int] = frozenset(),
) -> MirroredOutputs:
    """The scenario's mirrored outputs compared, every request both engines answered but
    those `not_mirrored` (a session's later turns: each engine's own context)."""
    ref, cand = (
        {
            r.request_id: _output(r)
            for r in records.get(role, ())
            if r.ok and r.request_id not in not_mirrored
        }
        for role in ROLES
    )
    return compare_outputs(name, ref, cand, early_tokens)


# What a comparison and its stored document share, copied as they are both ways (the document
# keeps no scenario name: the scenario holds it).
_COUNTS = ("compared", "exact", "early", "early_tokens", "basis")


def outputs_doc(o: MirroredOutputs) -> OutputsDoc:
    return OutputsDoc(
        **{k: getattr(o, k) for k in _COUNTS},
        histogram=list(o.histogram),
        examples=[OutputExampleDoc(**dataclasses.asdict(e)) for e in o.examples],
        blocks=[(n, e) for n, e in o.blocks],
    )


def outputs_from_doc(name: str, doc: OutputsDoc) -> MirroredOutputs:
    """A stored comparison, for re-judge."""
    return MirroredOutputs(
        scenario=name,
        **{k: getattr(doc, k) for k in _COUNTS},
        histogram=tuple(doc.histogram),
        examples=tuple(OutputExample(**e.model_dump()) for e in doc.examples),
        blocks=tuple((n, e) for n, e in doc.blocks),
    )
