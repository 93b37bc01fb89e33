"""Startup phases an engine writes in its own log: where a slow or stuck startup spent its time.

The gate's own phases (lifecycle.py: process up, port open, /health 200, model listed) say when
an engine became reachable, not why it took long. A real engine logs the steps in between, so
the gate reads the engine's log while it starts and marks each step the first time its line
appears. Phases then carry the engine's own names, and the judge compares each phase's duration
(analysis/engines.py), so a candidate that loads weights 40 s slower is named as such.

Rules, per engine family, each with the source it follows (the lines are the engines' own log
formats, not an API: a release that rewords one loses that phase, and the startup checks note a
phase only one engine reached instead of holding):

- vLLM 0.32 (read from `bench/vllm/setup`'s CPU build, `tests/gate/engines/test_logphases.py`
  replays a real log; GPU lines from the same release's source):
  `config_resolved` "Resolved architecture:" (vllm/config/model.py), `weights_loaded`
  "Loading weights took" (model_executor/model_loader/default_loader.py) or "Model loading took"
  (v1/worker/gpu_model_runner.py), `warmed_up` "Warming up done." (v1/worker/cpu_model_runner.py)
  or "Graph capturing finished" (gpu_model_runner.py, CUDA graphs), `kv_cache_sized`
  "KV cache size: N tokens" (v1/core/kv_cache_utils.py), `engine_initialized`
  "init engine (profile, create kv cache, warmup model) took" (v1/engine/core.py), `api_up`
  "Starting vLLM server on" (entrypoints/launchers/api_server/entry.py; "Starting vLLM API
  server" before 0.11).
- SGLang (python/sglang/srt/model_executor/model_runner.py, managers/scheduler.py,
  entrypoints/http_server.py): "Load weight end", "KV Cache is allocated", "Capture cuda graph
  end", "The server is fired up and ready to roll".
- the sim: none. Its "sim: warming up" line comes as it binds its port, so it would mark the
  moment `port_open` marks, in either order (the watcher reads every 0.2 s, readiness polls
  back off to 1 s), and the durations of the two would swap between engines.

Bounded, because the engine under test writes the log: a poll reads at most
`MAX_READ_BYTES`, a line is matched on its first `MAX_LINE_CHARS` characters, and what reaches a
phase's detail is an escaped excerpt (readiness.excerpt).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

from gate.engines.lifecycle import PhaseLog

__all__ = ["LOG_PHASES", "RULES", "LogRule", "LogWatcher", "match_line"]

MAX_READ_BYTES = 64 << 10
"""The most of the log one poll reads (64 KiB); a chattier engine is read on the next poll."""

MAX_LINE_CHARS = 2000
"""Only the start of a longer line is matched (vLLM's config line runs to a few KiB)."""

POLL_S = 0.2
"""How often the log is read while the engine starts: how late, at most, a phase is marked."""


@dataclass(frozen=True, slots=True)
class LogRule:
    family: str
    phase: str
    pattern: re.Pattern[str]


def _rule(family: str, phase: str, pattern: str) -> LogRule:
    return LogRule(family, phase, re.compile(pattern))


RULES: tuple[LogRule, ...] = (
    _rule("vllm", "config_resolved", r"Resolved architecture: "),
    _rule("vllm", "weights_loaded", r"Loading weights took [\d.]+ ?s|Model loading took "),
    _rule("vllm", "warmed_up", r"Warming up done\.|Graph capturing finished in "),
    _rule("vllm", "kv_cache_sized", r"KV cache size: [\d,]+ tokens"),
    _rule(
        "vllm",
        "engine_initialized",
        r"init engine \(profile, create kv cache, warmup model\) took ",
    ),
    _rule("vllm", "api_up", r"Starting vLLM (?:API )?server on "),
    _rule("sglang", "weights_loaded", r"Load weight end\."),
    _rule("sglang", "kv_cache_sized", r"KV Cache is allocated\."),
    _rule("sglang", "warmed_up", r"Capture (?:\w+ )*[Cc][Uu][Dd][Aa] graph end"),
    _rule("sglang", "api_up", r"The server is fired up and ready to roll"),
)

LOG_PHASES: tuple[str, ...] = tuple(dict.fromkeys(r.phase for r in RULES))
"""Every phase a log can mark, in the order an engine usually reaches them."""

_ANY = re.compile("|".join(f"(?:{r.pattern.pattern})" for r in RULES))
"""One pass over a line says whether any rule could match: most lines match none, and a
chatty or hostile log must not cost a search per rule per line on the gate's event loop."""


def match_line(line: str, seen: set[str]) -> str | None:
    """The phase `line` marks, if it marks one not in `seen`."""
    head = line[:MAX_LINE_CHARS]
    if not head.strip() or _ANY.search(head) is None:
        return None
    for rule in RULES:
        if rule.phase not in seen and rule.pattern.search(head):
            return rule.phase
    return None


@dataclass
class LogWatcher:
    """Marks log phases on `phases` while an engine starts: `run()` polls the log from
    `offset` until cancelled; `drain()` reads what is left once (at ready, or at a failure)."""

    path: Path
    phases: PhaseLog
    offset: int = 0
    _partial: str = ""

    def drain(self) -> None:
        from gate.engines.readiness import excerpt

        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read(MAX_READ_BYTES)
        except OSError:
            return
        if not data:
            return
        self.offset += len(data)
        text = self._partial + data.decode("utf-8", "replace")
        lines = text.split("\n")
        # a line still being written: keep its start, which is what is matched
        self._partial = lines.pop()[:MAX_LINE_CHARS]
        seen = set(self.phases.reached)
        for line in lines:
            phase = match_line(line, seen)
            if phase is not None:
                seen.add(phase)
                self.phases.mark(phase, excerpt(line.strip()))

    async def run(self) -> None:
        while True:
            self.drain()
            await asyncio.sleep(POLL_S)
