"""Load generation for comparing LLM inference engines: one schedule, mirrored to every target.

Pure parts (``schedule``, ``prompts``, ``sse``, ``records``, ``metrics``) are separate from I/O
(``client``, ``runner``) so the core is tested exhaustively and the I/O is tested for real.
This package never imports ``gate``: the gate depends on it, not the other way round.

The names below load on first use (PEP 562), so a pure reader of one module (the judge
reads ``loadgen.suite.capacity``) does not import the HTTP client with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "Api": "loadgen.client",
    "RequestSpec": "loadgen.client",
    "Target": "loadgen.client",
    "make_client": "loadgen.client",
    "request_body": "loadgen.client",
    "send_request": "loadgen.client",
    "Distribution": "loadgen.metrics",
    "Summary": "loadgen.metrics",
    "distribution": "loadgen.metrics",
    "summarize": "loadgen.metrics",
    "WORDS": "loadgen.prompts",
    "LengthDist": "loadgen.prompts",
    "chat_messages": "loadgen.prompts",
    "synthetic_prompts": "loadgen.prompts",
    "ERROR_KINDS": "loadgen.records",
    "ErrorKind": "loadgen.records",
    "RequestRecord": "loadgen.records",
    "read_jsonl": "loadgen.records",
    "write_jsonl": "loadgen.records",
    "PairedResult": "loadgen.runner",
    "Pause": "loadgen.runner",
    "run_paired": "loadgen.runner",
    "ARRIVALS": "loadgen.schedule",
    "Arrival": "loadgen.schedule",
    "Phase": "loadgen.schedule",
    "PhasedSchedule": "loadgen.schedule",
    "build_offsets": "loadgen.schedule",
    "build_phased": "loadgen.schedule",
    "DONE": "loadgen.sse",
    "ServerSentEvent": "loadgen.sse",
    "SSEParser": "loadgen.sse",
    "LoadgenTransport": "loadgen.transport",
    "StreamTap": "loadgen.tap",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # the names for type checkers, re-exported
    from loadgen.client import Api as Api
    from loadgen.client import RequestSpec as RequestSpec
    from loadgen.client import Target as Target
    from loadgen.client import make_client as make_client
    from loadgen.client import request_body as request_body
    from loadgen.client import send_request as send_request
    from loadgen.metrics import Distribution as Distribution
    from loadgen.metrics import Summary as Summary
    from loadgen.metrics import distribution as distribution
    from loadgen.metrics import summarize as summarize
    from loadgen.prompts import WORDS as WORDS
    from loadgen.prompts import LengthDist as LengthDist
    from loadgen.prompts import chat_messages as chat_messages
    from loadgen.prompts import synthetic_prompts as synthetic_prompts
    from loadgen.records import ERROR_KINDS as ERROR_KINDS
    from loadgen.records import ErrorKind as ErrorKind
    from loadgen.records import RequestRecord as RequestRecord
    from loadgen.records import read_jsonl as read_jsonl
    from loadgen.records import write_jsonl as write_jsonl
    from loadgen.runner import PairedResult as PairedResult
    from loadgen.runner import Pause as Pause
    from loadgen.runner import run_paired as run_paired
    from loadgen.schedule import ARRIVALS as ARRIVALS
    from loadgen.schedule import Arrival as Arrival
    from loadgen.schedule import Phase as Phase
    from loadgen.schedule import PhasedSchedule as PhasedSchedule
    from loadgen.schedule import build_offsets as build_offsets
    from loadgen.schedule import build_phased as build_phased
    from loadgen.sse import DONE as DONE
    from loadgen.sse import ServerSentEvent as ServerSentEvent
    from loadgen.sse import SSEParser as SSEParser
    from loadgen.tap import StreamTap as StreamTap
    from loadgen.transport import LoadgenTransport as LoadgenTransport

__all__ = [
    "ARRIVALS",
    "DONE",
    "ERROR_KINDS",
    "WORDS",
    "Api",
    "Arrival",
    "Distribution",
    "ErrorKind",
    "LengthDist",
    "LoadgenTransport",
    "PairedResult",
    "Pause",
    "Phase",
    "PhasedSchedule",
    "RequestRecord",
    "RequestSpec",
    "SSEParser",
    "ServerSentEvent",
    "StreamTap",
    "Summary",
    "Target",
    "build_offsets",
    "build_phased",
    "chat_messages",
    "distribution",
    "make_client",
    "read_jsonl",
    "request_body",
    "run_paired",
    "send_request",
    "summarize",
    "synthetic_prompts",
    "write_jsonl",
]
