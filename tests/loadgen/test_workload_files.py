"""Workload files read strictly (loadgen/workload_files.py): the example files of
examples/workloads/ load, and each kind of mistake is an error naming the file as the spec
wrote it, the line and the field, without echoing the record's text.

The trace layout is Mooncake's as AIPerf replays it (ai-dynamo/aiperf
src/aiperf/dataset/loader/models.py, class MooncakeTrace: `timestamp` in milliseconds,
`input_length`, `output_length`, `hash_ids`; the 512-token block is Mooncake's and AIPerf's
default `--isl-block-size`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from loadgen.workload_files import (
    FileCaps,
    WorkloadFileError,
    read_request_log,
    read_sharegpt,
    read_trace,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"
CAPS = FileCaps()


def write(tmp_path: Path, *rows: Any) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_the_example_files_load() -> None:
    trace = read_trace(EXAMPLES / "mooncake-trace.jsonl", "t", CAPS, block_tokens=512)
    assert len(trace) == 400
    assert (
        trace[0].timestamp_s
        == json.loads((EXAMPLES / "mooncake-trace.jsonl").open().readline())["timestamp"] / 1000
    )
    assert all(r.input_length <= 512 * len(r.hash_ids) for r in trace)
    convs = read_sharegpt(EXAMPLES / "sharegpt-conversations.jsonl", "s", CAPS)
    assert len(convs) == 12 and all(len(c.turns) == len(c.answers) >= 1 for c in convs)
    assert "You answer briefly." not in {t for c in convs for t in c.turns}  # the system turn
    logged = read_request_log(EXAMPLES / "openai-requests.jsonl", "o", CAPS)
    assert len(logged) == 16
    assert {r.prompt is None for r in logged} == {True, False}
    assert all(r.max_tokens is not None for r in logged)


TRACE = {"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [0, 1]}


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({**TRACE, "input_length": "600"}, "input_length", "must be an integer"),
        ({**TRACE, "input_length": 0}, "input_length", "must be >= 1"),
        ({**TRACE, "output_length": 9000}, "output_length", "above the cap of 8192"),
        ({**TRACE, "input_length": 40000}, "input_length", "above the cap of 32768"),
        ({**TRACE, "timestamp": "noon"}, "timestamp", "milliseconds"),
        ({**TRACE, "timestamp": -5}, "timestamp", ">= 0"),
        ({k: v for k, v in TRACE.items() if k != "output_length"}, "output_length", "missing"),
        ({**TRACE, "hash_ids": [0, 1, 2]}, "hash_ids", "3 blocks of 512 tokens"),
        ({**TRACE, "hash_ids": [0, -1]}, "hash_ids[1]", "integer >= 0"),
        ({**TRACE, "hash_ids": "0,1"}, "hash_ids", "list of integers"),
        ({**TRACE, "session_id": "a"}, "session_id", "multi-turn trace rows"),
        ({**TRACE, "text_input": "hi"}, "text_input", "openai request-log format"),
        ({**TRACE, "priority": 1}, "priority", "not a field of this format"),
    ],
)
def test_a_trace_mistake_names_line_and_field(
    tmp_path: Path, row: dict[str, Any], field: str, words: str
) -> None:
    path = write(tmp_path, TRACE, "", row)  # the blank line counts as a line, not a record
    with pytest.raises(WorkloadFileError) as err:
        read_trace(path, "traces/prod.jsonl", CAPS, block_tokens=512)
    assert (err.value.line, err.value.field) == (3, field)
    assert str(err.value).startswith(f"traces/prod.jsonl line 3: {field}: ")
    assert words in str(err.value)
    assert str(tmp_path) not in str(err.value)  # the file as the spec named it, never where


def test_file_level_mistakes(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError, match=r"^t line 2: not JSON at column 2$"):
        read_trace(write(tmp_path, TRACE, "{{"), "t", CAPS, block_tokens=512)
    with pytest.raises(WorkloadFileError, match="line 1: a record must be a JSON object"):
        read_trace(write(tmp_path, "[1, 2]"), "t", CAPS, block_tokens=512)
    with pytest.raises(WorkloadFileError, match=r"^t: holds no records$"):
        read_trace(write(tmp_path, "", " "), "t", CAPS, block_tokens=512)
    with pytest.raises(WorkloadFileError, match=r"^t: cannot be read \(No such file"):
        read_trace(tmp_path / "missing.jsonl", "t", CAPS, block_tokens=512)
    (tmp_path / "bin.jsonl").write_bytes(json.dumps(TRACE).encode() + b"\n\xff\xfe\n")
    with pytest.raises(WorkloadFileError, match="line 2: not UTF-8 text"):
        read_trace(tmp_path / "bin.jsonl", "t", CAPS, block_tokens=512)


def test_the_operators_caps_bound_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, *[{**TRACE, "timestamp": 1000 * i} for i in range(5)])
    size = path.stat().st_size
    with pytest.raises(WorkloadFileError, match=f"^t: {size} bytes is above the cap of 100 bytes"):
        read_trace(path, "t", FileCaps(max_bytes=100), block_tokens=512)
    with pytest.raises(WorkloadFileError, match="line 4: more than the cap of 3 records"):
        read_trace(path, "t", FileCaps(max_lines=3), block_tokens=512)
    with pytest.raises(
        WorkloadFileError, match="timestamp: the trace spans 4 s, above the cap of 3 s"
    ):
        read_trace(path, "t", FileCaps(max_span_s=3), block_tokens=512)
    assert len(read_trace(path, "t", FileCaps(max_span_s=4), block_tokens=512)) == 5


def turn(role: str, value: Any) -> dict[str, Any]:
    return {"from": role, "value": value}


GOOD = {"conversations": [turn("human", "hi there"), turn("gpt", "hello")]}


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"conversations": []}, "conversations", "non-empty list"),
        ({"conversations": [turn("gpt", "hello")]}, "conversations[0].from", "before any human"),
        (
            {"conversations": [turn("human", "a"), turn("human", "b")]},
            "conversations[1].from",
            "two human turns",
        ),
        (
            {"conversations": [turn("human", "a"), turn("system", "b")]},
            "conversations[1].from",
            "only come first",
        ),
        ({"conversations": [turn("robot", "a")]}, "conversations[0].from", "not 'robot'"),
        ({"conversations": [turn("human", 3)]}, "conversations[0].value", "must be a string"),
        ({"conversations": [turn("system", "be brief")]}, "conversations", "has no human turn"),
        ({"conversations": ["hi"]}, "conversations[0]", "a turn must be an object"),
        ({**GOOD, "lang": "en"}, "lang", "not a field of this format"),
    ],
)
def test_a_sharegpt_mistake_names_line_and_field(
    tmp_path: Path, row: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(WorkloadFileError) as err:
        read_sharegpt(write(tmp_path, GOOD, row), "chats.jsonl", CAPS)
    assert (err.value.line, err.value.field) == (2, field), str(err.value)
    assert words in str(err.value)


def test_a_long_conversation_is_bounded_by_the_prompt_cap(tmp_path: Path) -> None:
    row = {"conversations": [turn("human", "word " * 30), turn("gpt", "word " * 30)]}
    with pytest.raises(
        WorkloadFileError,
        match=r"conversations\[1\]\.value: the conversation reaches about 60 tokens",
    ):
        read_sharegpt(write(tmp_path, row), "c", FileCaps(max_prompt_tokens=50))


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"model": "m"}, "messages", "exactly one of messages or prompt"),
        ({**CHAT, "prompt": "x"}, "messages", "exactly one of messages or prompt"),
        ({**CHAT, "messages": []}, "messages", "non-empty list"),
        ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "one of"),
        ({**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string"),
        (
            {**CHAT, "messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages[0].tool_calls",
            "not a message field",
        ),
        (
            {**CHAT, "messages": [{"role": "assistant", "content": "x"}]},
            "messages[0].role",
            "the last must ask",
        ),
        ({**CHAT, "max_tokens": 0}, "max_tokens", ">= 1"),
        ({**CHAT, "max_completion_tokens": 5}, "max_completion_tokens", "one of max_tokens"),
        ({**CHAT, "temperature": 0.7}, "temperature", "not a field of this format"),
        ({"prompt": ""}, "prompt", "non-empty string"),
    ],
)
def test_a_request_log_mistake_names_line_and_field(
    tmp_path: Path, row: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(WorkloadFileError) as err:
        read_request_log(write(tmp_path, CHAT, row), "log.jsonl", CAPS)
    assert (err.value.line, err.value.field) == (2, field), str(err.value)
    assert words in str(err.value)


def test_a_fifo_is_not_a_workload_file(tmp_path: Path) -> None:
    """Only a regular file has a size to cap before it is read (review: a FIFO or a device in
    the operator's directory was read with no bound)."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(WorkloadFileError, match="t: is not a regular file"):
        read_trace(fifo, "t", CAPS, block_tokens=512)
