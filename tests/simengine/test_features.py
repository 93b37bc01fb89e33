"""`--max-logprobs` and `--without`: a sim that lacks a feature the way real engines do,
against real sim processes over real HTTP (and the flags' parsing)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from simengine.cli import build_parser, parse_args
from simengine.config import SimConfig
from simengine.features import FEATURES, Served, parse_features
from simengine.launch import SimHandle, SimPool
from simengine.protocol import NO_CHAT_TEMPLATE

FAST = ("--load-s", "0", "--warmup-s", "0", "--ttft-ms", "1", "--itl-ms", "1", "--jitter", "0")
GREEDY = {"temperature": 0, "ignore_eos": True}
CHAT = [{"role": "user", "content": "the quick brown fox"}]

Start = Callable[..., httpx.Client]


@pytest.fixture(scope="module")
def start(module_launcher: SimPool) -> Iterator[Start]:
    """``start(*flags)``: a client of a sim started with those flags, one sim per set of flags
    for the whole module."""
    clients: dict[tuple[str, ...], httpx.Client] = {}

    def get(*flags: str) -> httpx.Client:
        if flags not in clients:
            sim: SimHandle = module_launcher.start(*FAST, *flags)
            clients[flags] = httpx.Client(base_url=sim.url, timeout=10.0)
        return clients[flags]

    yield get
    for client in clients.values():
        client.close()


def completion(client: httpx.Client, **fields: Any) -> httpx.Response:
    return client.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3, **fields})


def chat(client: httpx.Client, **fields: Any) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, **fields})


def events(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of a stream that must end with [DONE]."""
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        data = [ln[6:] for ln in resp.iter_lines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]" and "[DONE]" not in data[:-1]
    return [json.loads(d) for d in data[:-1]]


def refusal(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 400, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    return error


# --------------------------------------------------------------------------- the flags


def test_defaults_serve_everything_with_vllms_limit() -> None:
    config = parse_args(["--port", "0"])
    assert (config.max_logprobs, config.without) == (20, ())
    assert config.served() == Served(20, True, True, True, True, True)


def test_without_is_repeatable_and_takes_comma_lists() -> None:
    config = parse_args(
        ["--port", "0", "--max-logprobs", "5", "--without", "token_ids, chat", "--without", "chat"]
    )
    assert config == SimConfig(port=0, max_logprobs=5, without=("chat", "token_ids"))
    served = config.served()
    assert (served.max_logprobs, served.chat, served.token_ids) == (5, False, False)
    assert served.logprobs and served.prompt_logprobs and served.stream_usage
    assert parse_features(",".join(FEATURES)) == FEATURES


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-logprobs", "-1"], "--max-logprobs must be in [0, --vocab-size 4096], got -1"),
        (
            ["--vocab-size", "64", "--max-logprobs", "65"],
            "--max-logprobs must be in [0, --vocab-size 64], got 65",
        ),
        (["--max-logprobs", "many"], "argument --max-logprobs: invalid int value: 'many'"),
        (["--without", "echo"], "argument --without: unknown feature 'echo'; the features are"),
        (["--without", "chat,tokens"], "unknown feature 'tokens'"),
        (["--without", " , "], "argument --without: no feature named"),
    ],
)
def test_bad_values_name_the_option_and_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--port", "0", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_the_options_and_every_feature() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "--max-logprobs N" in text and "--without FEATURE[,FEATURE]" in text
    for feature in FEATURES:
        assert feature in text


# --------------------------------------------------------------------------- --max-logprobs


@pytest.mark.parametrize("limit", [20, 5])
def test_the_limit_is_served_and_one_more_is_vllms_400(start: Start, limit: int) -> None:
    client = start() if limit == 20 else start("--max-logprobs", str(limit))
    ok = completion(client, logprobs=limit, **GREEDY)
    assert ok.status_code == 200, ok.text
    assert all(len(top) >= limit for top in ok.json()["choices"][0]["logprobs"]["top_logprobs"])
    ok = chat(client, logprobs=True, top_logprobs=limit)
    assert ok.status_code == 200, ok.text
    assert all(
        len(e["top_logprobs"]) == limit for e in ok.json()["choices"][0]["logprobs"]["content"]
    )
    ok = completion(client, prompt_logprobs=limit)
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["prompt_logprobs"]) == 3

    over = limit + 1
    for resp, kind, param in (
        (completion(client, logprobs=over), "sample", "logprobs"),
        (completion(client, logprobs=over, stream=True), "sample", "logprobs"),
        (chat(client, logprobs=True, top_logprobs=over), "sample", "top_logprobs"),
        (chat(client, logprobs=True, top_logprobs=over, stream=True), "sample", "top_logprobs"),
        (completion(client, prompt_logprobs=over), "prompt", "prompt_logprobs"),
        (chat(client, prompt_logprobs=over), "prompt", "prompt_logprobs"),
    ):
        error = refusal(resp)
        assert error["message"] == (
            f"Requested {kind} logprobs of {over}, which is greater than max allowed: {limit}"
        )
        assert error["param"] == param


def test_max_logprobs_0_refuses_one_or_more_and_serves_the_chosen_tokens_own(
    start: Start,
) -> None:
    client = start("--max-logprobs", "0")
    for resp in (
        completion(client, logprobs=1),
        chat(client, logprobs=True, top_logprobs=1),
        completion(client, prompt_logprobs=1),
    ):
        assert "greater than max allowed: 0" in refusal(resp)["message"]
    # As in vLLM, where 0 asks for no alternatives: the chosen token's logprob still comes.
    lp = completion(client, logprobs=0, **GREEDY).json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == 3 and all(v <= 0 for v in lp["token_logprobs"])
    assert [list(top) for top in lp["top_logprobs"]] == [[t] for t in lp["tokens"]]
    content = chat(client, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(e["top_logprobs"] == [] for e in content)
    scored = completion(client, prompt_logprobs=0).json()["choices"][0]["prompt_logprobs"]
    assert scored[0] is None and all(len(e) == 1 for e in scored[1:])


# --------------------------------------------------------------------------- --without


def test_without_logprobs_answers_without_them(start: Start) -> None:
    full, bare = start(), start("--without", "logprobs")
    asked = completion(bare, logprobs=5, **GREEDY)
    assert asked.status_code == 200, asked.text
    choice = asked.json()["choices"][0]
    assert choice["logprobs"] is None
    assert choice["text"] == completion(full, logprobs=5, **GREEDY).json()["choices"][0]["text"]
    assert chat(bare, logprobs=True, top_logprobs=3).json()["choices"][0]["logprobs"] is None
    # ignored, so not checked either: over the limit, or top_logprobs without logprobs
    assert completion(bare, logprobs=50).status_code == 200
    assert chat(bare, top_logprobs=2).status_code == 200
    assert chat(full, top_logprobs=2).status_code == 400
    for ev in events(bare, "/v1/completions", {"prompt": "a", "max_tokens": 3, "logprobs": 2}):
        assert ev["choices"][0]["logprobs"] is None
    # the other features stay
    scored = completion(bare, prompt_logprobs=2, return_token_ids=True).json()["choices"][0]
    assert len(scored["prompt_logprobs"]) == 3 and len(scored["token_ids"]) == 3


def test_without_prompt_logprobs_ignores_them_as_llama_cpp_does(start: Start) -> None:
    full, bare = start(), start("--without", "prompt_logprobs")
    assert "prompt_logprobs" in completion(full, prompt_logprobs=1).json()["choices"][0]
    asked = completion(bare, prompt_logprobs=1, logprobs=2, **GREEDY)
    assert asked.status_code == 200, asked.text
    choice = asked.json()["choices"][0]
    assert "prompt_logprobs" not in choice and "prompt_logprobs" not in asked.json()
    assert len(choice["logprobs"]["top_logprobs"]) == 3  # sample logprobs stay
    body = chat(bare, prompt_logprobs=1).json()
    assert "prompt_logprobs" not in body and "prompt_logprobs" not in body["choices"][0]
    # ignored, so never refused: over the limit, or with a stream (vLLM refuses both)
    assert completion(bare, prompt_logprobs=99).status_code == 200
    assert completion(full, prompt_logprobs=1, stream=True).status_code == 400
    chunks = events(bare, "/v1/completions", {"prompt": "a", "max_tokens": 2, "prompt_logprobs": 1})
    assert all("prompt_logprobs" not in ev["choices"][0] for ev in chunks)


def test_without_token_ids_ignores_return_token_ids(start: Start) -> None:
    full, bare = start(), start("--without", "token_ids")
    ids = completion(full, return_token_ids=True).json()["choices"][0]
    assert len(ids["token_ids"]) == 3 and len(ids["prompt_token_ids"]) == 3
    for resp in (completion(bare, return_token_ids=True), chat(bare, return_token_ids=True)):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        for where in (body, body["choices"][0]):
            assert "token_ids" not in where and "prompt_token_ids" not in where
    for path, body in (
        ("/v1/completions", {"prompt": "a b", "max_tokens": 3}),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 3}),
    ):
        chunks = events(bare, path, {**body, "return_token_ids": True})
        assert len(chunks) >= 3
        for ev in chunks:
            assert "prompt_token_ids" not in ev
            assert all("token_ids" not in c and "prompt_token_ids" not in c for c in ev["choices"])
    assert completion(bare, return_token_ids="yes").status_code == 200  # not even read
    assert completion(full, return_token_ids="yes").status_code == 400


def test_without_stream_usage_ignores_stream_options(start: Start) -> None:
    full, bare = start(), start("--without", "stream_usage")
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"prompt": "a b", "max_tokens": 3, "stream_options": options}
    with_usage = events(full, "/v1/completions", body)
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"] == 3
    assert all("usage" in ev for ev in with_usage)
    for path, request in (
        ("/v1/completions", body),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "stream_options": options}),
    ):
        chunks = events(bare, path, request)
        assert all("usage" not in ev for ev in chunks)
        assert all(ev["choices"] for ev in chunks)  # no usage-only chunk
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert completion(bare).json()["usage"]["completion_tokens"] == 3  # a whole answer keeps it
    # ignored, so not checked: stream_options without a stream (vLLM refuses it)
    assert completion(bare, stream_options={"include_usage": True}).status_code == 200
    assert completion(full, stream_options={"include_usage": True}).status_code == 400


def test_without_chat_answers_chat_with_vllms_no_template_400(start: Start) -> None:
    bare = start("--without", "chat")
    for resp in (chat(bare), chat(bare, stream=True), chat(bare, logprobs=True, top_logprobs=2)):
        error = refusal(resp)
        assert error["message"] == NO_CHAT_TEMPLATE and error["param"] is None
        assert resp.headers["content-type"].startswith("application/json")
    assert "no longer allowed" in NO_CHAT_TEMPLATE and "chat template" in NO_CHAT_TEMPLATE
    # the request's own mistakes and the model check come first, as in vLLM
    wrong_model = chat(bare, model="other")
    assert wrong_model.status_code == 404
    assert refusal(bare.post("/v1/chat/completions", json={"messages": []}))["param"] == "messages"
    tokenized = bare.post("/tokenize", json={"messages": CHAT})
    assert refusal(tokenized)["message"] == NO_CHAT_TEMPLATE
    assert bare.post("/tokenize", json={"prompt": "a b c"}).json()["count"] == 3
    # completions are untouched, with every other feature
    ok = completion(bare, logprobs=2, prompt_logprobs=1, return_token_ids=True).json()
    choice = ok["choices"][0]
    assert len(choice["token_ids"]) == 3 and len(choice["prompt_logprobs"]) == 3
    assert len(choice["logprobs"]["tokens"]) == 3
    assert bare.get("/v1/models").json()["data"][0]["id"] == "demo-model"
