"""Prompt lengths in engine tokens: fitting, the estimate, and the real /tokenize of the sim."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadgen import Target, make_client
from loadgen.prompts import WORDS
from loadgen.tokens import TokenCounter, estimate_tokens, fit_prompt, tokenize_url


class Doubling(TokenCounter):
    """A fake engine whose tokenizer makes two tokens of every word."""

    async def count(self, text: str) -> int:
        self.calls += 1
        return 2 * len(text.split())


def test_fit_prompt_converges_on_another_tokenizer() -> None:
    counter = Doubling(Target("t", "http://h:1"), None)  # type: ignore[arg-type]
    words = list(WORDS[:200])
    prompt, count = asyncio.run(fit_prompt(words, 50, counter))
    assert count == 50
    assert len(prompt.split()) == 25
    assert counter.calls <= 4
    prompt, count = asyncio.run(fit_prompt(words, 51, counter))  # odd: best fit below
    assert count == 50


def test_estimate_and_url() -> None:
    assert estimate_tokens("able about above") == 3
    assert estimate_tokens("x" * 40) == 10  # unknown text: about four characters a token
    assert tokenize_url(Target("t", "http://h:1/v1")) == "http://h:1/tokenize"


def test_engine_tokenize_on_the_sim(sim: Any) -> None:
    async def main(url: str) -> tuple[str, int, Any]:
        target = Target("t", url)
        async with make_client(target, 2) as client:
            counter = await TokenCounter.connect(target, client)
            n = await counter.count("one two three")
            return counter.source, n, await fit_prompt(list(WORDS[:40]), 17, counter)

    with sim() as url:
        source, n, (prompt, count) = asyncio.run(main(url))
    assert source == "engine"
    assert n == 3
    assert count == 17 and len(prompt.split()) == 17


def test_no_tokenize_endpoint_falls_back_to_the_estimate() -> None:
    async def main() -> str:
        target = Target("t", "http://127.0.0.1:9")
        async with make_client(target, 1) as client:
            return (await TokenCounter.connect(target, client)).source

    assert asyncio.run(main()) == "estimate"


@pytest.mark.parametrize("n", [0, -1])
def test_fit_rejects_bad_lengths(n: int) -> None:
    counter = Doubling(Target("t", "http://h:1"), None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens"):
        asyncio.run(fit_prompt(["a"], n, counter))


def test_an_endless_tokenize_answer_is_not_read_whole() -> None:
    """An engine whose /tokenize streams without end costs at most the cap: the counter
    falls back to the estimate instead of reading it all."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from loadgen.tokens import TOKENIZE_BODY_BYTES

    sent: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            n, chunk = 0, b'{"tokens": [' + b"1," * 32_000
            try:
                while n < 16 * TOKENIZE_BODY_BYTES:
                    self.wfile.write(chunk)
                    n += len(chunk)
            except OSError:
                pass
            sent.append(n)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def main() -> str:
        target = Target("t", f"http://127.0.0.1:{server.server_address[1]}")
        async with make_client(target, 1) as client:
            return (await TokenCounter.connect(target, client)).source

    try:
        assert asyncio.run(main()) == "estimate"
    finally:
        server.shutdown()
        server.server_close()
    assert sent and max(sent) < 8 * TOKENIZE_BODY_BYTES  # read to the cap, then dropped
