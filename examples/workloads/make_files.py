"""Writes the example workload files of this folder (made here, nothing downloaded):

    python examples/workloads/make_files.py

- mooncake-trace.jsonl: 400 records in Mooncake's trace layout (timestamp in ms, input and
  output lengths, hash_ids of 512-token blocks): 4 groups of shared system-prompt blocks, a
  few long documents, a burst every 16 s; about 32 s of traffic;
- short-trace.jsonl: 24 records in the same layout sized for the real-vLLM CPU test bed
  (tiny models with a 1024-token context, about 2.3 tokens per word of ours): 2 requests/s
  for 12 s, prompts of 40 to 120 words in blocks of 32 (`block_tokens: 32` in the spec), 3
  shared first blocks;
- sharegpt-conversations.jsonl: 12 ShareGPT-style conversations of 1 to 4 turns, some with a
  system turn;
- openai-requests.jsonl: 16 logged request bodies, chat and completions, as a gateway logs
  them (model, stream and stream_options included: the gate sets those itself).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = (
    "the a model answer question about river mountain city light code data network engine "
    "queue token cache prefix session memory batch"
)


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS.split()) for _ in range(n))


def trace(rng: random.Random) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    t, nid = 0, 100
    for _ in range(400):
        burst = (t // 8000) % 2 == 1 and (t % 8000) < 1500
        t += rng.randint(5, 40) if burst else rng.randint(40, 170)
        g = rng.randrange(4)
        ids = [2 * g] if g < 2 else [2 * g, 2 * g + 1]
        extra = rng.choice([0, 0, 1, 1, 2, 4])
        ids += list(range(nid, nid + extra))
        nid += extra
        n_in = 512 * len(ids) - rng.randint(0, 400)
        out.append(
            {
                "timestamp": t,
                "input_length": n_in,
                "output_length": rng.randint(8, 64),
                "hash_ids": ids,
            }
        )
    return out


def short_trace(rng: random.Random) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    t, nid = 0, 100
    for _ in range(24):
        t += rng.randint(250, 750)
        ids = [rng.randrange(3)]
        extra = rng.choice([0, 1, 2])
        ids += list(range(nid, nid + extra))
        nid += extra
        n_in = 32 * len(ids) + rng.randint(8, 24)
        out.append(
            {
                "timestamp": t,
                "input_length": n_in,
                "output_length": rng.randint(4, 10),
                "hash_ids": ids,
            }
        )
    return out


def conversations(rng: random.Random) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(12):
        turns = [{"from": "system", "value": "You answer briefly."}] if i % 4 == 0 else []
        for _ in range(rng.randint(1, 4)):
            turns.append({"from": "human", "value": _text(rng, rng.randint(8, 40)) + "?"})
            turns.append({"from": "gpt", "value": _text(rng, rng.randint(10, 60)) + "."})
        out.append({"id": f"conv-{i}", "conversations": turns})
    return out


def requests(rng: random.Random) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(16):
        if i % 3 == 0:
            out.append(
                {
                    "model": "prod-model",
                    "prompt": _text(rng, rng.randint(10, 60)),
                    "max_tokens": rng.randint(8, 32),
                    "stream": True,
                }
            )
            continue
        messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": _text(rng, rng.randint(10, 80))},
        ]
        out.append(
            {
                "model": "prod-model",
                "messages": messages,
                "max_completion_tokens": rng.randint(8, 32),
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
    return out


def main() -> None:
    rng = random.Random(33)
    for name, rows in (
        ("mooncake-trace.jsonl", trace(rng)),
        ("sharegpt-conversations.jsonl", conversations(rng)),
        ("short-trace.jsonl", short_trace(rng)),
        ("openai-requests.jsonl", requests(rng)),
    ):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
