"""Logprobs in the shapes real engines send, read into one form (a pure core, no I/O).

Two shapes reach ``choice["logprobs"]``:

- vLLM's completions form (OpenAI's legacy ``/v1/completions``): parallel lists ``tokens``,
  ``token_logprobs`` and ``top_logprobs``, the last a list of {token: logprob} dicts.
- The OpenAI chat form, ``{"content": [{token, logprob, bytes, top_logprobs}]}``, which some
  engines also answer ``/v1/completions`` with (llama.cpp's ``llama-server``, captured in
  ``shared/captures/llamacpp-completions-logprobs.http``). Entries may carry the token ``id``
  (llama.cpp does); ``top_logprobs`` is a list of entries or, from some servers, a dict.

A logprob sent as ``null`` (vLLM's NaN) or not a number reads NaN, so the judge can count it.

vLLM keys its completions ``top_logprobs`` by each token's decoded text, so tokens that decode
to the same text (byte tokens of a byte-level BPE all decode to "" or "\ufffd" alone) collapse
into one key: asked for 20, real vLLM 0.32.0 answered 16 to 19 entries per position
(tests/support/captures/vllm/). Asked with ``return_tokens_as_token_ids`` (vLLM's
``entrypoints/openai`` serving code), every token reads ``token_id:N`` instead, in ``tokens``,
in the keys of ``top_logprobs`` and in chat entries' ``token``: those are read as ids here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Shape = Literal["completions", "content"]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One answer's sampled tokens with their logprobs and top-k alternatives.

    ``ids`` are the token ids the entries name, where every entry names one (else None:
    the engine's ``token_ids`` or the text must serve)."""

    shape: Shape
    tokens: list[str]
    logprobs: list[float]
    top: list[dict[str, float]]
    ids: list[int] | None
    top_ids: list[dict[int, float]] | None = None
    """The top-k keyed by token id, where every entry of every position names its id
    (llama.cpp's): texts are not unique (byte tokens all read "\ufffd"), ids are."""


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return float("nan")
    return float(value)


_TOKEN_ID = re.compile(r"token_id:(\d{1,9})")


def _id_of(token: Any) -> int | None:
    """N of vLLM's ``token_id:N`` (``return_tokens_as_token_ids``), else None."""
    m = _TOKEN_ID.fullmatch(token) if isinstance(token, str) else None
    return int(m.group(1)) if m else None


def _ids_of(tokens: list[Any]) -> list[int] | None:
    ids = [_id_of(t) for t in tokens]
    return [i for i in ids if i is not None] if ids and None not in ids else None


def _top_ids_by_key(top: dict[str, float]) -> dict[int, float] | None:
    out = {_id_of(k): v for k, v in top.items()}
    return None if not out or None in out else {k: v for k, v in out.items() if k is not None}


def _top_of(value: Any) -> dict[str, float]:
    """A top-k as a {token: logprob} dict, from a dict or a list of entries."""
    if isinstance(value, Mapping):
        return {str(k): _number(v) for k, v in value.items()}
    if isinstance(value, list):
        return {
            str(e["token"]): _number(e.get("logprob"))
            for e in value
            if isinstance(e, Mapping) and "token" in e
        }
    return {}


def _top_ids_of(value: Any) -> dict[int, float] | None:
    """A list of top entries as {id: logprob}; None unless every entry has an int id."""
    if not isinstance(value, list) or not value:
        return None
    out: dict[int, float] = {}
    for e in value:
        i = e.get("id") if isinstance(e, Mapping) else None
        if not isinstance(i, int) or isinstance(i, bool):
            return None
        out[i] = _number(e.get("logprob"))
    return out


def parse_logprobs(lp: Any) -> TokenLogprobs | None:
    """The logprobs object of one choice (or one stream chunk's choice) in either shape;
    None when it is absent or in neither shape."""
    if not isinstance(lp, Mapping):
        return None
    content = lp.get("content")
    if isinstance(content, list):
        entries = [e for e in content if isinstance(e, Mapping)]
        ids = [e.get("id") for e in entries]
        tokens = [str(e.get("token", "")) for e in entries]
        top = [_top_of(e.get("top_logprobs")) for e in entries]
        named = _ids_of(tokens)
        return TokenLogprobs(
            "content",
            tokens,
            [_number(e.get("logprob")) for e in entries],
            top,
            [int(i) for i in ids if isinstance(i, int)]
            if entries and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            else named,
            _all_or_none([_top_ids_of(e.get("top_logprobs")) for e in entries])
            or (_all_or_none([_top_ids_by_key(t) for t in top]) if named is not None else None),
        )
    values = lp.get("token_logprobs")
    if not isinstance(values, list):
        return None
    listed = lp.get("tokens")
    tops = lp.get("top_logprobs")
    top = [_top_of(t) for t in tops] if isinstance(tops, list) else []
    named = _ids_of(listed) if isinstance(listed, list) else None
    return TokenLogprobs(
        "completions",
        [str(t) for t in listed] if isinstance(listed, list) else [],
        [_number(v) for v in values],
        top,
        named,
        _all_or_none([_top_ids_by_key(t) for t in top]) if named is not None else None,
    )


def _all_or_none(tops: list[dict[int, float] | None]) -> list[dict[int, float]] | None:
    if not tops or any(t is None for t in tops):
        return None
    return [t for t in tops if t is not None]


def concatenate(parts: list[TokenLogprobs]) -> TokenLogprobs | None:
    """A streamed answer's logprobs, chunk after chunk, as one."""
    if not parts:
        return None
    ids: list[int] | None = []
    for p in parts:
        ids = ids + p.ids if ids is not None and p.ids is not None else None
    return TokenLogprobs(
        parts[0].shape,
        [t for p in parts for t in p.tokens],
        [v for p in parts for v in p.logprobs],
        [t for p in parts for t in p.top],
        ids,
        _all_or_none([t for p in parts for t in (p.top_ids or [None])]),  # type: ignore[list-item]
    )
