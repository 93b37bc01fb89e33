"""guidellm 0.8.1's client as a peer in ``loadgen_bench``: how to run it offline, read it, match it.

guidellm lives in its own virtual environment (default ``/tmp/guidellm-venv``; ``pip install
guidellm==0.8.1`` there) so that its dependencies (torch, transformers, datasets) stay out of
the project. Nothing here imports guidellm: it is run as a command and its JSON report is read.

Offline: guidellm's ``synthetic_text`` data needs a Hugging Face tokenizer to cut prompts to a
token count. No tokenizer is downloaded: :func:`build_tokenizer` writes a word-level tokenizer
(the words Faker, guidellm's text source, draws from, plus ``.`` and ``,``) into a local
directory with guidellm's own Python, and guidellm loads it from that path with
``HF_HUB_OFFLINE=1``. A 16-token prompt is then about 16 words, close to loadgen's estimate.

What guidellm's report keeps per request (``benchmarks[0].requests.successful[*].info.timings``,
Unix seconds from ``time.time()``): ``targeted_start`` (when the schedule meant the request to
go), ``request_start`` (when httpx began writing its headers), ``first_token_iteration``,
``last_token_iteration``, ``request_end`` and ``request_iterations`` (non-blank SSE lines, so
content chunks + the usage chunk + ``[DONE]``). It keeps no per-token times, so guidellm's ITL
can only be checked as a per-request mean, ``(last - first) / (output_tokens - 1)``; and it sends
no request id of its own to the server (the response id is the server's), so its requests are
matched to the sim's truth log by their send and token times, see :func:`match_by_time`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

DEFAULT_VENV = Path("/tmp/guidellm-venv")
VERSION = "0.8.1"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

# Run with guidellm's Python: a word-level tokenizer over Faker's word list, saved for
# ``AutoTokenizer.from_pretrained(<dir>)``. Unknown words map to [UNK]; nothing is downloaded.
_TOKENIZER_SCRIPT = """
import sys
from faker import Faker
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, ".": 1, ",": 2}
for word in sorted(set(Faker().get_words_list())):
    for form in (word, word.capitalize()):
        vocab.setdefault(form, len(vocab))
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


@dataclass(frozen=True)
class Install:
    exe: Path
    python: Path
    version: str


def not_installed_line(path: Path) -> str:
    return f"guidellm: not installed (pip install guidellm=={VERSION} into {path})"


def find(path: Path) -> Install | None:
    """A guidellm install from a virtual environment directory or its ``guidellm`` script."""
    exe = path / "bin" / "guidellm" if path.is_dir() else path
    python = exe.with_name("python")
    if not exe.is_file() or not python.exists():
        return None
    probe = "import importlib.metadata as m; print(m.version('guidellm'))"
    try:
        out = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return Install(exe, python, out.stdout.strip())


def build_tokenizer(install: Install, dest: Path) -> None:
    subprocess.run(
        [str(install.python), "-c", _TOKENIZER_SCRIPT, str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def command(
    install: Install,
    url: str,
    *,
    rate: float,
    requests: int,
    prompt_tokens: int,
    output_tokens: int,
    tokenizer: Path,
    output: Path,
    model: str = "demo-model",
) -> list[str]:
    """``guidellm run``: constant rate, ``requests`` requests, streaming /v1/completions,
    synthetic prompts, ``ignore_eos`` (guidellm sets it when the data fixes output tokens),
    report as JSON; guidellm's defaults otherwise (10 worker processes, HTTP/2 allowed)."""
    backend = f"kind=openai_http,target={url},model={model},request_format=/v1/completions"
    data = f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}"
    return [
        str(install.exe),
        "run",
        "--backend",
        backend,
        "--profile",
        f"kind=constant,rate={rate:g}",
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--data",
        data,
        "--output",
        f"kind=json,path={output}",
        "--disable-console",
    ]


@dataclass(frozen=True)
class Request:
    """One guidellm request, Unix seconds as guidellm wrote them."""

    status: str
    targeted_s: float | None
    start_s: float | None
    first_token_s: float | None
    last_token_s: float | None
    end_s: float | None
    output_tokens: int
    iterations: int


def load_report(path: Path) -> list[Request]:
    """Every request of the report's single benchmark, in send order."""
    report: dict[str, Any] = json.loads(path.read_text())
    out: list[Request] = []
    for bench in report["benchmarks"]:
        groups: dict[str, Any] = bench["requests"]
        for status in ("successful", "errored", "incomplete"):
            for item in groups.get(status) or []:
                timings = item["info"]["timings"]
                out.append(
                    Request(
                        status=status,
                        targeted_s=timings.get("targeted_start"),
                        start_s=timings.get("request_start"),
                        first_token_s=timings.get("first_token_iteration"),
                        last_token_s=timings.get("last_token_iteration"),
                        end_s=timings.get("request_end"),
                        output_tokens=int(item.get("output_tokens") or 0),
                        iterations=int(timings.get("request_iterations") or 0),
                    )
                )
    out.sort(key=lambda r: r.start_s if r.start_s is not None else float("inf"))
    return out


def match_by_time(
    client_ms: Sequence[tuple[float, float, float]],
    truth_ms: Sequence[tuple[float, float, float]],
    *,
    send_slack_ms: float = 1.0,
    emit_slack_ms: float = 10.0,
) -> list[tuple[int, int]]:
    """Pair guidellm's requests with the sim's truth lines when no id is shared.

    ``client_ms`` holds (sent, first token received, last token received) per request and
    ``truth_ms`` (arrival, first event emitted, last event emitted) per truth line, all on the
    monotonic clock in ms (the caller moves guidellm's ``time.time()`` stamps over with an offset
    taken around the run). A pair is possible only if it is causal: the request was sent before
    it arrived (``send_slack_ms`` for the clock offset's error), and each token was received
    after it was emitted, with ``emit_slack_ms``: the sim stamps an event right after writing
    it, so a client on the other core can read it first, by milliseconds when the sim is
    preempted in between (seen here on a busy machine). Among the possible one-to-one pairings,
    the one with the least sum of squared delivery delays (first and last token) is taken
    (``linear_sum_assignment``).
    Send-to-arrival lag is not part of the cost: guidellm stamps ``request_start`` before httpx
    writes the request, and that lag varies by tens of ms on a busy machine, more than the
    spacing of requests, so pairing by send order or nearest send time mismatches; delivery
    delays stay at a few ms. Returns ``(client index, truth index)`` pairs.
    """
    if not client_ms or not truth_ms:
        return []
    c = np.asarray(client_ms, dtype=float)
    t = np.asarray(truth_ms, dtype=float)
    lag = t[None, :, 0] - c[:, None, 0]
    first = c[:, None, 1] - t[None, :, 1]
    last = c[:, None, 2] - t[None, :, 2]
    causal = (lag >= -send_slack_ms) & (first >= -emit_slack_ms) & (last >= -emit_slack_ms)
    big = 1e12
    cost = np.where(causal, first**2 + last**2, big)
    rows, cols = linear_sum_assignment(cost)
    return sorted((int(i), int(j)) for i, j in zip(rows, cols, strict=True) if causal[i, j])
