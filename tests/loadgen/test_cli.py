"""The ``loadgen`` command against a server in a second thread (the CLI runs its own loop)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from loadgen.cli import main
from loadgen.records import read_jsonl

KEYS = {
    "requests",
    "errors_by_kind",
    "ttft_ms",
    "itl_ms",
    "tpot_ms",
    "e2e_ms",
    "dispatch_delay_ms",
    "output_tokens",
    "duration_s",
    "throughput",
}


def test_json_summary_open_loop(
    threaded_server: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    records = tmp_path / "records.jsonl"
    argv = ["--url", threaded_server.url, "--rate", "100", "--arrival", "constant"]
    argv += ["--requests", "10", "--prompt-tokens", "6", "--max-tokens", "3"]
    argv += ["--records", str(records), "--json", "--ignore-eos"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary) == KEYS
    assert summary["requests"] == {"sent": 10, "ok": 10, "errors": 0, "resent": 0}
    assert summary["output_tokens"] == 30
    assert set(summary["throughput"]) == {"requests_per_s", "output_tokens_per_s"}
    written = list(read_jsonl(records))
    assert [r.request_id for r in written] == list(range(10))
    received = [r for r in threaded_server.server.received if r.path != "/tokenize"]
    assert len(received) == 10
    assert all(len(r.body["prompt"].split()) == 6 for r in received)
    assert all(r.body["ignore_eos"] is True for r in received)


def test_table_output_closed_loop_chat(
    threaded_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--url", threaded_server.url, "--api", "chat", "--concurrency", "2"]
    argv += ["--requests", "4", "--max-tokens", "2", "--prompt-tokens", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "TTFT ms" in out
    assert "4/4 ok" in out
    assert threaded_server.server.max_active <= 2
    paths = {r.path for r in threaded_server.server.received}
    assert paths == {"/tokenize", "/v1/chat/completions"}  # the length probe, then the load


def test_every_request_failing_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["--url", f"http://127.0.0.1:{port}", "--concurrency", "1", "--requests", "2"]
    assert main([*argv, "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["errors_by_kind"]["connect"] == 2


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--rate", "1"], "--url"),
        (["--url", "http://h"], "--rate"),
        (["--url", "http://h", "--rate", "1", "--concurrency", "2"], "--concurrency"),
        (["--url", "http://h", "--rate", "0"], "--rate"),
        (["--url", "http://h", "--rate", "x"], "--rate"),
        (["--url", "http://h", "--concurrency", "0"], "--concurrency"),
        (["--url", "http://h", "--rate", "1", "--requests", "-3"], "--requests"),
        (["--url", "http://h", "--rate", "1", "--requests", "2", "--duration", "1"], "--duration"),
        (["--url", "http://h", "--concurrency", "2", "--duration", "1"], "--duration"),
        (["--url", "http://h", "--rate", "1", "--arrival", "bursty"], "--arrival"),
        (["--url", "http://h", "--rate", "1", "--burstiness", "-1"], "--burstiness"),
        (["--url", "http://h", "--rate", "1", "--api", "embeddings"], "--api"),
        (["--url", "ftp://h", "--rate", "1"], "--url"),
        (
            ["--url", "http://h", "--rate", "1", "--requests", "999", "--prompt-tokens", "1"],
            "--prompt-tokens",
        ),
    ],
)
def test_argument_errors_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert flag in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--concurrency" in capsys.readouterr().out


def test_workers_json_and_slo(
    threaded_server: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    records = tmp_path / "r.jsonl"
    argv = ["--url", threaded_server.url, "--rate", "200", "--requests", "20", "--workers", "2"]
    argv += ["--max-tokens", "2", "--prompt-tokens", "4", "--json", "--records", str(records)]
    argv += ["--slo", "ttft_ms=5000", "--slo", "tpot_ms=5000", "--tokenizer", "estimate"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary) == KEYS | {"goodput"}
    assert summary["requests"] == {"sent": 20, "ok": 20, "errors": 0, "resent": 0}
    assert summary["goodput"]["requests"] == 20
    assert [r.request_id for r in read_jsonl(records)] == list(range(20))


def test_scenario_with_phases(threaded_server: Any, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--url", threaded_server.url, "--scenario", "normal", "--rate", "100"]
    argv += ["--requests", "5", "--max-tokens", "2", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["requests"]["sent"] == 5
    assert main([*argv[:3], "recovery", "--json", "--requests", "5"]) == 2  # not a knob of it
    assert "--scenario" in capsys.readouterr().err
