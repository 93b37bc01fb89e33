"""Load generation for comparing LLM inference engines: one schedule, mirrored to every target.

Pure parts (``schedule``, ``prompts``, ``sse``, ``records``, ``metrics``) are separate from I/O
(``client``, ``runner``) so the core is tested exhaustively and the I/O is tested for real.
This package never imports ``gate``: the gate depends on it, not the other way round.
"""

from loadgen.client import Api, RequestSpec, Target, make_client, request_body, send_request
from loadgen.metrics import Distribution, Summary, distribution, summarize
from loadgen.prompts import WORDS, LengthDist, chat_messages, synthetic_prompts
from loadgen.records import ERROR_KINDS, ErrorKind, RequestRecord, read_jsonl, write_jsonl
from loadgen.runner import PairedResult, Pause, run_paired
from loadgen.schedule import ARRIVALS, Arrival, Phase, PhasedSchedule, build_offsets, build_phased
from loadgen.sse import DONE, ServerSentEvent, SSEParser
from loadgen.transport import LoadgenTransport, StreamTap

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
