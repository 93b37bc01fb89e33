"""Workloads from files: ShareGPT-style conversations and recorded request traces.

Nothing is downloaded: both read a local JSONL file that the user brings (or a test writes).
Both are strict about shape and name the line of a bad record, because a silently skipped
record changes the workload being measured.

ShareGPT lines: ``{"conversations": [{"from": "human"|"gpt", "value": ...}, ...]}`` (the
``system`` role and vLLM's ``user``/``assistant`` spellings are accepted too). Trace lines:
``{"timestamp": <seconds>, "prompt": ... | "messages": [...], "max_tokens": N}``; timestamps
may be relative or absolute (epoch seconds, or ISO-8601), only differences matter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from loadgen.client import RequestSpec
from loadgen.prompts import Conversation
from loadgen.tokens import estimate_tokens

_HUMAN = {"human", "user"}
_ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "model"}


def _lines(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with Path(path).open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{number}: a line must be a JSON object")
            yield number, obj


def load_sharegpt(path: str | Path, *, limit: int | None = None) -> list[Conversation]:
    """Conversations in file order: the human turns, and the answers that followed them.

    A conversation without any human turn is skipped (ShareGPT dumps contain some); a
    malformed one is an error naming its line.
    """
    out: list[Conversation] = []
    for number, obj in _lines(path):
        if limit is not None and len(out) >= limit:
            break
        turns = obj.get("conversations")
        if not isinstance(turns, list):
            raise ValueError(f"{path}:{number}: needs a 'conversations' list")
        users: list[str] = []
        answers: list[str] = []
        for turn in turns:
            if not isinstance(turn, dict):
                raise ValueError(f"{path}:{number}: a turn must be an object")
            role, value = turn.get("from"), turn.get("value")
            if not isinstance(role, str) or not isinstance(value, str):
                raise ValueError(f"{path}:{number}: a turn needs string 'from' and 'value'")
            if role in _HUMAN:
                users.append(value)
            elif role in _ASSISTANT and len(answers) < len(users):
                answers.append(value)
        if users:
            out.append(Conversation(tuple(users), tuple(answers)))
    return out


def conversation_requests(
    conversations: list[Conversation],
    *,
    max_tokens: int | None = None,
    multi_turn: bool = True,
    start_id: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> list[RequestSpec]:
    """Requests for conversations: every turn chained to the one before (``parent``), or with
    ``multi_turn=False`` only each conversation's first turn.

    ``max_tokens`` fixed for every turn, or ``None`` to use the reference answer's estimated
    length (vLLM bench's convention for ShareGPT), 128 where there is none. Requests are
    ordered conversation by conversation, so a turn's index follows its parent's.
    """
    specs: list[RequestSpec] = []
    rid = start_id
    for conv in conversations:
        parent: int | None = None
        for k, text in enumerate(conv.turns if multi_turn else conv.turns[:1]):
            if max_tokens is not None:
                n = max_tokens
            elif k < len(conv.answers):
                n = max(1, estimate_tokens(conv.answers[k]))
            else:
                n = 128
            specs.append(RequestSpec(rid, text, n, dict(extra or {}), parent=parent))
            parent = rid
            rid += 1
    return specs


@dataclass(frozen=True, slots=True)
class Trace:
    """A recorded workload: when each request was sent, and what it was."""

    offsets_s: npt.NDArray[np.float64]
    requests: list[RequestSpec]


def load_trace(
    path: str | Path,
    *,
    speedup: float = 1.0,
    limit: int | None = None,
    default_max_tokens: int = 128,
    extra: Mapping[str, Any] | None = None,
) -> Trace:
    """Replay a JSONL trace: offsets are timestamps minus the first, divided by ``speedup``.

    Records are sorted by timestamp (stably, so equal timestamps keep file order) and get
    request ids in that order, so the same file always gives the same schedule.
    """
    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"speedup: must be a finite number > 0, got {speedup!r}")
    rows: list[tuple[float, RequestSpec]] = []
    for number, obj in _lines(path):
        if limit is not None and len(rows) >= limit:
            break
        ts = _timestamp(obj.get("timestamp"), f"{path}:{number}")
        prompt = obj.get("prompt")
        messages = obj.get("messages")
        if isinstance(messages, list) and messages:
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise ValueError(f"{path}:{number}: each message needs a string 'role'")
            text = prompt if isinstance(prompt, str) else ""
            spec_messages: tuple[Mapping[str, Any], ...] | None = tuple(messages)
        elif isinstance(prompt, str):
            text, spec_messages = prompt, None
        else:
            raise ValueError(f"{path}:{number}: needs a 'prompt' string or a 'messages' list")
        max_tokens = obj.get("max_tokens", default_max_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"{path}:{number}: max_tokens must be an integer >= 1")
        spec = RequestSpec(0, text, max_tokens, dict(extra or {}), messages=spec_messages)
        rows.append((ts, spec))
    if not rows:
        raise ValueError(f"{path}: no requests in the trace")
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    t0 = rows[order[0]][0]
    offsets = np.array([(rows[i][0] - t0) / speedup for i in order], dtype=np.float64)
    requests = [
        RequestSpec(
            rid, rows[i][1].prompt, rows[i][1].max_tokens, rows[i][1].extra, rows[i][1].messages
        )
        for rid, i in enumerate(order)
    ]
    return Trace(offsets_s=offsets, requests=requests)


def _timestamp(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise ValueError(f"{where}: 'timestamp' must be seconds or an ISO-8601 time, got {value!r}")
