"""ShareGPT conversations and trace replay from local JSONL files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadgen.datasets import conversation_requests, load_sharegpt, load_trace


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_sharegpt_turns_and_answers(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.jsonl",
        [
            {
                "conversations": [
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "a b c"},
                ]
            },
            {"conversations": [{"from": "gpt", "value": "orphan"}]},  # no human turn: skipped
            {
                "conversations": [
                    {"from": "system", "value": "be brief"},
                    {"from": "human", "value": "one"},
                    {"from": "gpt", "value": "x"},
                    {"from": "human", "value": "two"},
                ]
            },
        ],
    )
    convs = load_sharegpt(path)
    assert convs == load_sharegpt(path)
    assert [c.turns for c in convs] == [("hi",), ("one", "two")]
    assert convs[0].answers == ("a b c",)
    specs = conversation_requests(convs)
    assert [(s.request_id, s.prompt, s.parent) for s in specs] == [
        (0, "hi", None),
        (1, "one", None),
        (2, "two", 1),
    ]
    assert specs[0].max_tokens == 3  # the reference answer's length
    assert specs[2].max_tokens == 128  # no answer recorded
    first_only = conversation_requests(convs, multi_turn=False, max_tokens=7)
    assert [(s.prompt, s.max_tokens) for s in first_only] == [("hi", 7), ("one", 7)]
    assert len(load_sharegpt(path, limit=1)) == 1


def test_sharegpt_errors_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl", [{"conversations": []}, {"nope": 1}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_sharegpt(path)


def test_trace_replay_is_sorted_relative_and_reproducible(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 1000.5, "prompt": "second", "max_tokens": 4},
            {"timestamp": 1000.0, "messages": [{"role": "user", "content": "first"}]},
            {"timestamp": "1970-01-01T00:16:42+00:00", "prompt": "third", "max_tokens": 2},
        ],
    )
    trace = load_trace(path, speedup=2.0)
    again = load_trace(path, speedup=2.0)
    np.testing.assert_array_equal(trace.offsets_s, again.offsets_s)
    np.testing.assert_allclose(trace.offsets_s, [0.0, 0.25, 1.0])
    assert [r.request_id for r in trace.requests] == [0, 1, 2]
    assert trace.requests[0].messages == ({"role": "user", "content": "first"},)
    assert [r.prompt for r in trace.requests[1:]] == ["second", "third"]
    assert [r.max_tokens for r in trace.requests] == [128, 4, 2]


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "x"},
        {"timestamp": 1, "prompt": 3},
        {"timestamp": 1, "prompt": "x", "max_tokens": 0},
    ],
)
def test_trace_errors(tmp_path: Path, row: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"t.jsonl:1"):
        load_trace(write(tmp_path / "t.jsonl", [row]))
