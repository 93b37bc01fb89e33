"""llama.cpp's captured responses (``../shared/captures/``, ``curl -i -N`` of ``llama-server``;
see that folder's README) served again over a socket, byte for byte, for tests of what reads
them: the streaming client (tests/loadgen/test_captures_replay.py) and capability discovery
(tests/loadgen/test_capabilities.py).

curl prints a chunked body with its chunk framing removed, so the replay sends the captured
status line, headers and body bytes unchanged and frames the body again, one chunk per SSE event
(llama.cpp writes one event per chunk: its server's ``sink.write`` per ``data:`` line).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

__all__ = ["CAPTURES", "VLLM_CAPTURES", "capture_path", "replay", "split_capture"]

CAPTURES = Path(__file__).resolve().parents[2].parent / "shared" / "captures"
VLLM_CAPTURES = Path(__file__).resolve().parent / "captures" / "vllm"
"""vLLM's own answers (bench/vllm/capture against the test bed; see that folder's README)."""


def capture_path(name: str) -> Path:
    """A capture by file name: vLLM's (``vllm-*``) from this repository, the rest from
    ``../shared/captures``."""
    return (VLLM_CAPTURES if name.startswith("vllm-") else CAPTURES) / name


def split_capture(raw: bytes) -> tuple[bytes, bytes]:
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        head, _, body = raw.partition(b"\n\n")
    return head, body


@asynccontextmanager
async def replay(name: str) -> AsyncIterator[str]:
    """A server answering every request with the capture `name`, byte for byte."""
    head, body = split_capture(capture_path(name).read_bytes())
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    chunked = any(ln.lower() == b"transfer-encoding: chunked" for ln in lines)
    response = b"\r\n".join(lines) + b"\r\n\r\n"
    if chunked:
        events = [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]
        response += b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    else:
        response += body

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in request.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client closed, or the test ended with the connection kept alive
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()
