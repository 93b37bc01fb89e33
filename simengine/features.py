"""What the sim answers beyond text, so that it can stand for an engine that lacks a feature.

Engines differ in more than speed: vLLM refuses more top logprobs than its `--max-logprobs`
(20 by default) with a 400, and answers chat with a 400 for a model that has no chat template;
llama.cpp's server ignores `prompt_logprobs` and `return_token_ids` (answering as if they were
not sent, `../shared/captures/`); servers without OpenAI's `stream_options` send no usage
chunk. The gate must tell "a reference without X" from "a candidate that lost X", so the sim
can be either (`--max-logprobs`, `--without`). Everything is on by default, as in vLLM.

Stdlib only: the flags are parsed (config.py) without importing the toy model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

Feature = Literal["chat", "logprobs", "prompt_logprobs", "stream_usage", "token_ids"]
FEATURES: tuple[Feature, ...] = get_args(Feature)
DEFAULT_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def parse_features(text: str) -> tuple[Feature, ...]:
    """``"token_ids,chat"`` -> ("token_ids", "chat"); ValueError naming an unknown one."""
    out: list[Feature] = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        known = next((f for f in FEATURES if f == name), None)
        if known is None:
            raise ValueError(f"unknown feature {name!r}; the features are: {', '.join(FEATURES)}")
        out.append(known)
    if not out:
        raise ValueError(f"no feature named; the features are: {', '.join(FEATURES)}")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Served:
    """The features one sim serves; the defaults are vLLM's (everything on, 20 logprobs).

    ``max_logprobs`` caps completions' ``logprobs``, chat's ``top_logprobs`` and
    ``prompt_logprobs`` as vLLM's ``--max-logprobs`` does (more is a 400). A feature that is
    off is ignored in requests, as llama.cpp ignores what it does not know, except ``chat``:
    the chat endpoint answers 400, as vLLM does for a model without a chat template.
    """

    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    chat: bool = True
    logprobs: bool = True
    prompt_logprobs: bool = True
    stream_usage: bool = True
    token_ids: bool = True

    @classmethod
    def build(cls, max_logprobs: int, without: Iterable[Feature]) -> Served:
        off = set(without)
        return cls(max_logprobs, **{f: f not in off for f in FEATURES})


ALL_SERVED = Served()
