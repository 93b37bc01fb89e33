"""Shapes that real traffic has, built up front into one open-loop schedule.

A scenario's arrival process (``loadgen.schedule``) gives the instants at which *units* of
traffic start; each unit is drawn, seeded, from a mix of parts by their shares:

- ``synthetic``: one request of ``prompt_tokens`` random words (what a plain scenario sends);
- ``long_context``: the same, near the context limit (``prompt_tokens`` large): a share of
  long prompts in an otherwise short stream is what fills a KV cache and stalls decodes;
- ``shared_prefix``: one of ``groups`` prefixes of ``prefix_tokens`` words (a system prompt, a
  document) and a unique question of ``prompt_tokens`` after it: what a prefix cache serves;
- ``sessions``: a chat of ``turns`` turns, ``think_s`` seconds of user think time between an
  answer and the next question; every turn after the first is sent with the conversation so
  far *with that engine's own earlier answers* (``RequestSpec.parent``, ``loadgen.runner``);
- ``sharegpt``: a recorded conversation (``loadgen.workload_files``), sent as sessions;
- ``openai``: a logged request body, sent as it was asked.

A later turn's offset is its session's start plus ``think_s`` per turn before it: the
earliest it could leave. The runner sends it at the later of that and its parent's answer on
that engine plus ``think_s``, so an engine that answers slower gets its later turns later,
as a real user of it would; the two engines' contexts differ after the first turn too. A
paired comparison of later turns is a comparison of the same turn of the same session, not of
the same bytes at the same instant (``Traffic.later_turns`` lets a reader leave them out
where that matters: mirrored outputs).

A trace (``replay_trace``) is its own schedule: its recorded instants, or those instants
time-scaled to a mean rate, and prompts built from its ``hash_ids``: equal ids give equal
blocks of ``block_tokens`` words, so requests that shared a prefix in production share it
here, and a prefix cache sees the reuse the trace recorded.

Every prompt is seeded words from :data:`loadgen.prompts.WORDS` (one token each on the sim),
so the same spec and seed give the same bytes to both engines and on every run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from loadgen.client import RequestSpec
from loadgen.prompts import Conversation, synthetic_prompts
from loadgen.tokens import estimate_tokens
from loadgen.workload_files import LoggedRequest, TraceRow

PartKind = Literal["synthetic", "long_context", "shared_prefix", "sessions", "sharegpt", "openai"]
PART_KINDS: tuple[PartKind, ...] = (
    "synthetic",
    "long_context",
    "shared_prefix",
    "sessions",
    "sharegpt",
    "openai",
)

__all__ = ["PART_KINDS", "Part", "PartKind", "Traffic", "build_mix", "replay_trace"]


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a mix (module docstring); the fields a kind does not use are ignored."""

    kind: PartKind
    share: float = 1.0
    prompt_tokens: int = 128
    max_tokens: int = 32
    turns: int = 0  # sessions: turns per session; sharegpt: most turns taken (0: all)
    think_s: float = 0.0
    groups: int = 1
    prefix_tokens: int = 0
    conversations: Sequence[Conversation] = ()
    logged: Sequence[LoggedRequest] = ()

    @property
    def multi_turn(self) -> bool:
        return self.kind == "sharegpt" or (self.kind == "sessions" and self.turns > 1)


@dataclass(frozen=True, slots=True)
class Traffic:
    """The requests (ids 0..n-1 in send order), their offsets, and per request the part it
    came from and its turn in its session (0: a first turn, or a lone request)."""

    requests: list[RequestSpec]
    offsets_s: npt.NDArray[np.float64]
    kinds: tuple[str, ...]
    turns: tuple[int, ...]
    sessions: int
    notes: tuple[str, ...] = field(default=())

    @property
    def later_turns(self) -> frozenset[int]:
        """Ids of the requests whose context holds an engine's own earlier answers."""
        return frozenset(r.request_id for r in self.requests if r.parent is not None)

    def prompt_words(self) -> list[int]:
        """Each request's own prompt length in words (tokens on the sim); a later turn's
        context also holds the turns and answers before it, which differ per engine."""
        out = []
        for r in self.requests:
            if r.messages is not None:
                out.append(sum(estimate_tokens(str(m.get("content", ""))) for m in r.messages))
            else:
                out.append(estimate_tokens(r.prompt))
        return out


# --------------------------------------------------------------------------- mixes

_Unit = tuple[float, int, int, RequestSpec, str]  # offset, unit, turn, request, kind


def build_mix(
    parts: Sequence[Part],
    unit_offsets: npt.NDArray[np.float64],
    *,
    seed: int,
    extra: Mapping[str, Any],
) -> Traffic:
    """One unit per offset, each drawn from ``parts`` by share (seeded), expanded into its
    requests and sorted by offset (a session's turns stay after their parent)."""
    if not parts:
        raise ValueError("parts: need at least one part")
    shares = np.array([p.share for p in parts], dtype=np.float64)
    if not np.all(np.isfinite(shares)) or np.any(shares <= 0):
        raise ValueError("share: every part's share must be a finite number > 0")
    rng = np.random.default_rng(seed)
    n = int(unit_offsets.size)
    pick = rng.choice(len(parts), size=n, p=shares / shares.sum()) if len(parts) > 1 else None
    units: list[_Unit] = []
    for k, part in enumerate(parts):
        mine = np.flatnonzero(pick == k) if pick is not None else np.arange(n)
        if mine.size:
            units += _expand(part, mine, unit_offsets, seed * 7_919 + 101 * (k + 1), extra)
    units.sort(key=lambda u: (u[0], u[1], u[2]))
    # Keyed by (unit, turn), not by the provisional id: a session of more than 1024 turns
    # (a long ShareGPT conversation, `turns` up to 10,000) would give two requests one id and
    # chain a turn to another session's answer.
    renumber: dict[tuple[int, int], int] = {}
    requests: list[RequestSpec] = []
    for new_id, (_, unit, turn, req, _) in enumerate(units):
        renumber[(unit, turn)] = new_id
        parent = renumber[(unit, turn - 1)] if req.parent is not None else None
        requests.append(_with_id(req, new_id, parent))
    sessions = sum(1 for u in units if u[2] == 0 and u[4] in ("sessions", "sharegpt"))
    return Traffic(
        requests,
        np.array([u[0] for u in units], dtype=np.float64),
        tuple(u[4] for u in units),
        tuple(u[2] for u in units),
        sessions,
    )


def _with_id(req: RequestSpec, rid: int, parent: int | None) -> RequestSpec:
    return RequestSpec(
        rid, req.prompt, req.max_tokens, req.extra, req.messages, parent, think_s=req.think_s
    )


def _expand(
    part: Part,
    units: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.float64],
    seed: int,
    extra: Mapping[str, Any],
) -> list[_Unit]:
    """A part's requests for its units; request ids are provisional (unit * 1024 + turn)."""
    kind = part.kind
    out: list[_Unit] = []
    if kind in ("synthetic", "long_context"):
        prompts = synthetic_prompts(units.size, part.prompt_tokens, seed=seed)
        for u, text in zip(units.tolist(), prompts, strict=True):
            out.append((float(offsets[u]), u, 0, _req(u, 0, text, part.max_tokens, extra), kind))
    elif kind == "shared_prefix":
        prefixes = synthetic_prompts(part.groups, part.prefix_tokens, seed=seed)
        questions = synthetic_prompts(units.size, part.prompt_tokens, seed=seed + 1)
        for j, u in enumerate(units.tolist()):
            text = f"{prefixes[j % part.groups]} {questions[j]}"
            out.append((float(offsets[u]), u, 0, _req(u, 0, text, part.max_tokens, extra), kind))
    elif kind == "sessions":
        turns = max(1, part.turns)
        prompts = synthetic_prompts(units.size * turns, part.prompt_tokens, seed=seed)
        for j, u in enumerate(units.tolist()):
            chat = Conversation(tuple(prompts[j * turns : (j + 1) * turns]))
            out += _session(part, chat, u, float(offsets[u]), extra)
    elif kind == "sharegpt":
        convs = part.conversations
        for j, u in enumerate(units.tolist()):
            out += _session(part, convs[j % len(convs)], u, float(offsets[u]), extra)
    else:
        logged = part.logged
        for j, u in enumerate(units.tolist()):
            out.append(
                (float(offsets[u]), u, 0, _logged(part, logged[j % len(logged)], u, extra), kind)
            )
    return out


def _req(
    unit: int, turn: int, text: str, max_tokens: int, extra: Mapping[str, Any], **kw: Any
) -> RequestSpec:
    return RequestSpec(unit * 1024 + turn, text, max_tokens, dict(extra), **kw)


def _session(
    part: Part, chat: Conversation, unit: int, start: float, extra: Mapping[str, Any]
) -> list[_Unit]:
    """A session's turns, each after the one before; a recorded answer sizes its turn's
    max_tokens (vLLM bench's convention for ShareGPT), at most the part's."""
    taken = chat.turns if part.turns <= 0 else chat.turns[: part.turns]
    out: list[_Unit] = []
    for k, text in enumerate(taken):
        n = part.max_tokens
        if part.kind == "sharegpt" and k < len(chat.answers):
            n = min(n, max(1, estimate_tokens(chat.answers[k])))
        parent = unit * 1024 + k - 1 if k else None
        think = part.think_s if k else 0.0
        req = _req(unit, k, text, n, extra, parent=parent, think_s=think)
        out.append((start + k * part.think_s, unit, k, req, part.kind))
    return out


def _logged(part: Part, row: LoggedRequest, unit: int, extra: Mapping[str, Any]) -> RequestSpec:
    n = row.max_tokens if row.max_tokens is not None else part.max_tokens
    if row.messages is not None:
        return _req(unit, 0, "", n, extra, messages=tuple(dict(m) for m in row.messages))
    assert row.prompt is not None
    return _req(unit, 0, row.prompt, n, extra)


# --------------------------------------------------------------------------- traces


def replay_trace(
    rows: Sequence[TraceRow],
    *,
    rate: float | None,
    requests: int | None,
    duration_s: float | None,
    block_tokens: int,
    seed: int,
    extra: Mapping[str, Any],
) -> Traffic:
    """The trace's records in time order at their recorded instants (``rate`` None) or
    time-scaled to a mean of ``rate`` requests/s; the first ``requests`` of them, or those
    before ``duration_s``. Errors name the scenario field they come from."""
    if not rows:
        raise ValueError("workload: the trace holds no records")
    order = sorted(range(len(rows)), key=lambda i: rows[i].timestamp_s)
    ts = np.array([rows[i].timestamp_s for i in order], dtype=np.float64)
    offsets = ts - ts[0]
    if rate is not None:
        span = float(offsets[-1])
        if len(rows) < 2 or span <= 0:
            raise ValueError("rate: the trace's records share one instant; nothing to time-scale")
        offsets = offsets * ((len(rows) - 1) / rate / span)
    keep = len(rows)
    if requests is not None:
        if requests > len(rows):
            raise ValueError(f"requests: the trace holds {len(rows)} records, not {requests}")
        keep = requests
    elif duration_s is not None:
        keep = int(np.searchsorted(offsets, duration_s, side="left"))
        if keep == 0:
            raise ValueError(f"duration_s: no record of the trace starts before {duration_s:g} s")
    blocks: dict[int, list[str]] = {}
    out: list[RequestSpec] = []
    for rid, i in enumerate(order[:keep]):
        row = rows[i]
        words = _trace_words(row, blocks, block_tokens, seed)
        out.append(RequestSpec(rid, " ".join(words), row.output_length, dict(extra)))
    shared = sum(1 for i in order[:keep] if rows[i].hash_ids)
    notes = (f"{shared} of {keep} records name shared prefix blocks (hash_ids)",)
    return Traffic(out, offsets[:keep].copy(), ("trace",) * keep, (0,) * keep, 0, notes)


def _trace_words(
    row: TraceRow, blocks: dict[int, list[str]], block_tokens: int, seed: int
) -> list[str]:
    """The row's hash blocks in order (equal ids, equal words), cut or filled up to its
    input_length with words of its own (seeded by its line: distinct across rows)."""
    words: list[str] = []
    for h in row.hash_ids:
        if h not in blocks:
            blocks[h] = synthetic_prompts(1, block_tokens, seed=_mix(seed, 2 * h))[0].split()
        words += blocks[h]
    words = words[: row.input_length]
    missing = row.input_length - len(words)
    if missing > 0:
        words += synthetic_prompts(1, missing, seed=_mix(seed, 2 * row.line + 1))[0].split()
    return words


def _mix(seed: int, k: int) -> int:
    """A seed for item ``k`` of a file under ``seed``: non-negative, below 2**63."""
    return (seed * 1_000_003 + k) % (2**63 - 1)
