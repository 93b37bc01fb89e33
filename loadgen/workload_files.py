"""Workload files an operator brings, read strictly: ShareGPT-style conversations, request
traces in the Mooncake layout, and OpenAI-format request logs (JSONL, one record a line).

A record the reader skipped or guessed at would change the workload being measured without
anyone seeing it, so every mistake is an error naming the file (as the spec wrote it, never
the directory it was resolved in), the line and the field (:class:`WorkloadFileError`), and
every file is bounded by the operator's caps before and while it is read (:class:`FileCaps`:
bytes, lines, prompt and output tokens, seconds of trace). Nothing here echoes a record's
text back: a file's content is the operator's, and an error may reach an API caller.

Formats:

- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt", "value": "..."}, ...]}`` (also
  ``user``/``assistant`` and ``system``, as vLLM's bench reads them); turns alternate, the
  first that counts is a human one; a system turn may only open the conversation.
- ``trace``: ``{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}``,
  the layout of Mooncake's released traces that AIPerf replays (ai-dynamo/aiperf
  ``src/aiperf/dataset/loader/models.py`` class ``MooncakeTrace``: ``timestamp`` in
  milliseconds, ``hash_ids`` the ids of the prompt's 512-token blocks, equal ids meaning an
  equal prefix block; Mooncake's ``FAST25-release`` traces). ``hash_ids`` is optional;
  ``session_id``/``delay`` (AIPerf's multi-turn rows) are refused: such rows would need
  answers the trace does not hold.
- ``openai``: one ``/v1/chat/completions`` (``messages``) or ``/v1/completions`` (``prompt``)
  request body a line, as a proxy or a gateway logs them; ``max_tokens`` or
  ``max_completion_tokens`` optional. The gate sets ``model`` and ``stream``, so those are
  ignored, and the sampling parameters are the scenario's (both engines get the same): a
  line that sets one is refused rather than silently overridden.
"""

from __future__ import annotations

import json
import math
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.prompts import Conversation
from loadgen.tokens import estimate_tokens

__all__ = [
    "FileCaps",
    "LoggedRequest",
    "TraceRow",
    "WorkloadFileError",
    "read_request_log",
    "read_sharegpt",
    "read_trace",
]


class WorkloadFileError(ValueError):
    """A workload file that cannot be used: which file (as the spec named it), line and field."""

    def __init__(self, name: str, line: int | None, field: str | None, problem: str) -> None:
        self.name, self.line, self.field, self.problem = name, line, field, problem
        where = name if line is None else f"{name} line {line}"
        super().__init__(f"{where}: {field}: {problem}" if field else f"{where}: {problem}")


@dataclass(frozen=True, slots=True)
class FileCaps:
    """The operator's bounds on one workload file (gate/core/limits.py declares them)."""

    max_bytes: int = 64 * 1024 * 1024
    max_lines: int = 100_000
    max_prompt_tokens: int = 32_768
    max_output_tokens: int = 8_192
    max_span_s: float = 3_600.0


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One trace record: when (seconds from the file's epoch), how long in and out, and the
    ids of its shared prefix blocks."""

    line: int
    timestamp_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One logged request body: chat ``messages`` or a completions ``prompt``, and the output
    length it asked for (None: the scenario's)."""

    line: int
    messages: tuple[Mapping[str, str], ...] | None
    prompt: str | None
    max_tokens: int | None


def _records(path: Path, name: str, caps: FileCaps) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line, the file's size and line count
    bounded before anything past the cap is read."""
    try:
        st = path.stat()
    except OSError as exc:
        raise WorkloadFileError(name, None, None, f"cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device has no size to cap by
        raise WorkloadFileError(name, None, None, "is not a regular file")
    too_big = f"is above the cap of {caps.max_bytes} bytes"
    if st.st_size > caps.max_bytes:
        raise WorkloadFileError(name, None, None, f"{st.st_size} bytes {too_big}")
    seen = 0
    read = 0
    with path.open("rb") as fh:
        # a file still being written may grow past its stat: the bytes read are capped too
        for number, raw in enumerate(iter(lambda: fh.readline(caps.max_bytes + 1), b""), 1):
            read += len(raw)
            if read > caps.max_bytes:
                raise WorkloadFileError(name, number, None, f"the file {too_big}")
            if not raw.strip():
                continue
            seen += 1
            if seen > caps.max_lines:
                raise WorkloadFileError(
                    name, number, None, f"more than the cap of {caps.max_lines} records"
                )
            try:
                obj = json.loads(raw)
            except UnicodeDecodeError:
                raise WorkloadFileError(name, number, None, "not UTF-8 text") from None
            except ValueError as exc:
                where = getattr(exc, "colno", None)
                at = f" at column {where}" if where else ""
                raise WorkloadFileError(name, number, None, f"not JSON{at}") from None
            if not isinstance(obj, dict):
                raise WorkloadFileError(name, number, None, "a record must be a JSON object")
            yield number, obj
    if not seen:
        raise WorkloadFileError(name, None, None, "holds no records")


def _count(obj: Mapping[str, Any], key: str, where: tuple[str, int], cap: int) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadFileError(*where, key, f"must be an integer, got {type(value).__name__}")
    if value < 1:
        raise WorkloadFileError(*where, key, f"must be >= 1, got {value}")
    if value > cap:
        raise WorkloadFileError(*where, key, f"{value} is above the cap of {cap} tokens")
    return value


def _unknown(obj: Mapping[str, Any], known: frozenset[str], where: tuple[str, int]) -> None:
    for key in obj:
        if key not in known:
            shown = key if len(key) <= 40 else key[:40] + "…"
            raise WorkloadFileError(*where, shown, f"not a field of this format ({_list(known)})")


def _list(keys: frozenset[str]) -> str:
    return ", ".join(sorted(keys))


# --------------------------------------------------------------------------- ShareGPT

_HUMAN = frozenset({"human", "user"})
_ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bard", "model"})
_SHAREGPT_KEYS = frozenset({"conversations", "id"})


def read_sharegpt(path: Path, name: str, caps: FileCaps) -> list[Conversation]:
    """Every conversation: its human turns and the answers recorded after them."""
    out: list[Conversation] = []
    for number, obj in _records(path, name, caps):
        where = (name, number)
        _unknown(obj, _SHAREGPT_KEYS, where)
        turns = obj.get("conversations")
        if not isinstance(turns, list) or not turns:
            raise WorkloadFileError(*where, "conversations", "must be a non-empty list of turns")
        out.append(_conversation(turns, where, caps))
    return out


def _conversation(turns: list[Any], where: tuple[str, int], caps: FileCaps) -> Conversation:
    users: list[str] = []
    answers: list[str] = []
    context = 0
    for k, turn in enumerate(turns):
        at = f"conversations[{k}]"
        if not isinstance(turn, dict):
            raise WorkloadFileError(*where, at, "a turn must be an object")
        role, value = turn.get("from"), turn.get("value")
        if not isinstance(role, str):
            raise WorkloadFileError(*where, f"{at}.from", "must be a string")
        if not isinstance(value, str):
            raise WorkloadFileError(*where, f"{at}.value", "must be a string")
        if role == "system":
            if k != 0:
                raise WorkloadFileError(*where, f"{at}.from", "a system turn may only come first")
            continue
        if role in _HUMAN:
            if len(users) > len(answers):
                raise WorkloadFileError(*where, f"{at}.from", "two human turns in a row")
            users.append(value)
        elif role in _ASSISTANT:
            if len(answers) >= len(users):
                raise WorkloadFileError(*where, f"{at}.from", "an answer before any human turn")
            answers.append(value)
        else:
            raise WorkloadFileError(
                *where, f"{at}.from", f"must be human, user, gpt, assistant or system, not {role!r}"
            )
        context += estimate_tokens(value)
        if context > caps.max_prompt_tokens:
            raise WorkloadFileError(
                *where,
                f"{at}.value",
                f"the conversation reaches about {context} tokens here, above the cap of "
                f"{caps.max_prompt_tokens} prompt tokens",
            )
    if not users:
        raise WorkloadFileError(*where, "conversations", "has no human turn")
    return Conversation(tuple(users), tuple(answers))


# --------------------------------------------------------------------------- traces

_TRACE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
_TRACE_REFUSED = {
    "session_id": "multi-turn trace rows are not replayed (their answers are not in the file)",
    "delay": "multi-turn trace rows are not replayed (their answers are not in the file)",
    "text_input": "a trace row gives lengths, not text: use the openai request-log format",
    "messages": "a trace row gives lengths, not text: use the openai request-log format",
}


def read_trace(path: Path, name: str, caps: FileCaps, *, block_tokens: int) -> list[TraceRow]:
    """Every record in file order; the span of the timestamps bounded by ``max_span_s``."""
    rows: list[TraceRow] = []
    for number, obj in _records(path, name, caps):
        where = (name, number)
        for key, why in _TRACE_REFUSED.items():
            if key in obj:
                raise WorkloadFileError(*where, key, why)
        _unknown(obj, _TRACE_KEYS, where)
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise WorkloadFileError(*where, key, "missing")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise WorkloadFileError(*where, "timestamp", "must be a number of milliseconds")
        if ts < 0:
            raise WorkloadFileError(*where, "timestamp", f"must be >= 0, got {ts}")
        n_in = _count(obj, "input_length", where, caps.max_prompt_tokens)
        n_out = _count(obj, "output_length", where, caps.max_output_tokens)
        ids = _hash_ids(obj.get("hash_ids", []), where, n_in, block_tokens)
        rows.append(TraceRow(number, ts / 1000.0, n_in, n_out, ids))
    stamps = [r.timestamp_s for r in rows]
    span = max(stamps) - min(stamps)
    if span > caps.max_span_s:
        raise WorkloadFileError(
            name,
            None,
            "timestamp",
            f"the trace spans {span:.0f} s, above the cap of {caps.max_span_s:g} s per scenario",
        )
    return rows


def _hash_ids(value: Any, where: tuple[str, int], n_in: int, block: int) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise WorkloadFileError(*where, "hash_ids", "must be a list of integers")
    for k, h in enumerate(value):
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise WorkloadFileError(*where, f"hash_ids[{k}]", "must be an integer >= 0")
    most = math.ceil(n_in / block)
    if len(value) > most:
        raise WorkloadFileError(
            *where,
            "hash_ids",
            f"{len(value)} blocks of {block} tokens are more than input_length {n_in} holds "
            f"(at most {most})",
        )
    return tuple(value)


# --------------------------------------------------------------------------- request logs

_LOG_KEYS = frozenset(
    {"messages", "prompt", "max_tokens", "max_completion_tokens", "model", "stream", "user"}
)
_MESSAGE_KEYS = frozenset({"role", "content", "name"})
_ROLES = frozenset({"system", "user", "assistant", "developer"})


def read_request_log(path: Path, name: str, caps: FileCaps) -> list[LoggedRequest]:
    """Every logged request body in file order."""
    out: list[LoggedRequest] = []
    for number, obj in _records(path, name, caps):
        where = (name, number)
        if "stream_options" in obj:
            obj = {k: v for k, v in obj.items() if k != "stream_options"}  # the gate's to set
        _unknown(obj, _LOG_KEYS, where)
        has_messages, has_prompt = "messages" in obj, "prompt" in obj
        if has_messages == has_prompt:
            raise WorkloadFileError(*where, "messages", "give exactly one of messages or prompt")
        messages: tuple[Mapping[str, str], ...] | None = None
        prompt: str | None = None
        if has_messages:
            messages = _messages(obj["messages"], where)
            text = sum(estimate_tokens(m["content"]) for m in messages)
        else:
            prompt = obj["prompt"]
            if not isinstance(prompt, str) or not prompt:
                raise WorkloadFileError(*where, "prompt", "must be a non-empty string")
            text = estimate_tokens(prompt)
        if text > caps.max_prompt_tokens:
            field = "messages" if has_messages else "prompt"
            raise WorkloadFileError(
                *where,
                field,
                f"about {text} tokens, above the cap of {caps.max_prompt_tokens} prompt tokens",
            )
        keys = [k for k in ("max_tokens", "max_completion_tokens") if k in obj]
        if len(keys) > 1:
            raise WorkloadFileError(
                *where, keys[1], "give one of max_tokens, max_completion_tokens"
            )
        max_tokens = _count(obj, keys[0], where, caps.max_output_tokens) if keys else None
        out.append(LoggedRequest(number, messages, prompt, max_tokens))
    return out


def _messages(value: Any, where: tuple[str, int]) -> tuple[Mapping[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise WorkloadFileError(*where, "messages", "must be a non-empty list")
    out: list[Mapping[str, str]] = []
    for k, m in enumerate(value):
        at = f"messages[{k}]"
        if not isinstance(m, dict):
            raise WorkloadFileError(*where, at, "a message must be an object")
        for key in m:
            if key not in _MESSAGE_KEYS:
                raise WorkloadFileError(*where, f"{at}.{str(key)[:40]}", "not a message field")
        if m.get("role") not in _ROLES:
            raise WorkloadFileError(*where, f"{at}.role", f"must be one of {_list(_ROLES)}")
        if not isinstance(m.get("content"), str):
            raise WorkloadFileError(*where, f"{at}.content", "must be a string")
        out.append({k: v for k, v in m.items() if isinstance(v, str)})
    if out[-1]["role"] == "assistant":
        raise WorkloadFileError(*where, f"messages[{len(out) - 1}].role", "the last must ask")
    return tuple(out)
