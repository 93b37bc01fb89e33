"""The command line an operator meets first (issue 30), as real processes: `gate serve` says
"serving on" only once its port is bound, and one clear line on a busy one; its log lines carry
no terminal colour codes; `gate --version`; `gate token list` shows tokens, never a secret."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from gate.access.tokens import digest


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    out.update({"GATE_DATA_DIR": str(tmp_path / ".gate"), "TERM": "xterm-256color"})
    return out


def gate(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_serve_on_a_busy_port_says_so_and_never_serving_on(
    env: dict[str, str], busy_port: int
) -> None:
    done = gate(env, "serve", "--port", str(busy_port))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "serving on" not in done.stdout + done.stderr  # it was printed before the bind
    assert f"cannot serve on 127.0.0.1:{busy_port}: port {busy_port} is already in use" in (
        done.stderr
    )
    assert "--port" in done.stderr and "Traceback" not in done.stderr


def test_serve_says_serving_on_once_bound_and_logs_no_colour_codes(env: dict[str, str]) -> None:
    """`--port 0` is bound first, so the line names the real port; a client that connects as
    soon as the line is out is answered (the socket listens before the app starts). Its log
    lines go to a pipe, not a terminal: no escape codes (uvicorn's `color_message` carried
    them)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gate", "serve", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the line, or EOF if it died
        found = re.match(r"gate: serving on http://127\.0\.0\.1:(\d+) ", line)
        assert found, line
        port = int(found.group(1))
        assert port != 0
        r = httpx.get(f"http://127.0.0.1:{port}/v1/gates", timeout=60)
        assert r.status_code == 401  # the service, answering
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Application startup complete" in err and 'GET /v1/gates HTTP/1.1\\" 401' in err, err
    assert "\x1b" not in err and "color_message" not in err, err


def test_version(env: dict[str, str]) -> None:
    done = gate(env, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"gate {version('llm-deploy-gate')}"


def test_token_list_shows_tokens_never_their_secrets(env: dict[str, str]) -> None:
    made = {}
    for name, scopes in (("argo", "run"), ("dashboards", "read")):
        done = gate(env, "token", "create", name, "--scopes", scopes)
        assert done.returncode == 0, done.stderr
        made[name] = done.stdout.strip()
    assert gate(env, "token", "revoke", "dashboards").returncode == 0

    listed = gate(env, "token", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "SCOPES", "CREATED", "LAST", "USED"]
    assert len(lines) == 2 and lines[1].split()[1:3] == ["argo", "read,run"]
    assert "never" in lines[1]  # not used yet

    every = gate(env, "token", "list", "--all", "--json")
    rows = json.loads(every.stdout)
    assert [(r["name"], r["scopes"], r["revoked_at"] is None) for r in rows] == [
        ("argo", ["read", "run"], True),
        ("dashboards", ["read"], False),
    ]
    assert all(r["created_at"].endswith("Z") for r in rows)
    for out in (listed.stdout + listed.stderr, every.stdout + every.stderr):
        for token in made.values():
            assert token not in out and digest(token) not in out and token[3:12] not in out


DIES = """\
name: dies-at-start
model: demo-model
correctness: off
reference:
  command: ["python", "-m", "simengine", "--port", "{port}"]
candidate:
  command: ["python", "-c", "import sys; [print('early line', n, file=sys.stderr) for n in \
range(40)]; print('x' * 5000, file=sys.stderr); print('\\x1b[31mRuntimeError: CUDA error: out \
of memory\\x1b[0m', file=sys.stderr); sys.exit(3)"]
scenarios:
  - {name: steady, rate: 20, requests: 400, prompt_tokens: 16, max_tokens: 8}
"""


def test_an_engine_that_dies_at_start_shows_its_last_lines_in_the_terminal(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Its own words were only in the report; now the terminal shows its last lines under the
    verdict, bounded (12 lines of at most 300 characters), without its escape codes."""
    spec = tmp_path / "dies.yaml"
    spec.write_text(DIES)
    done = gate(env, "run", str(spec), timeout=120)
    assert done.returncode == 2, done.stderr
    out = done.stderr
    assert "candidate engine process exited with code 3" in out
    _, _, tail = out.partition("candidate engine's last 12 lines (all of it: ")
    assert tail, out
    shown = [line for line in tail.splitlines() if line.startswith("  | ")]
    assert len(shown) == 12
    assert shown[-1] == "  | RuntimeError: CUDA error: out of memory"  # no \x1b[31m
    assert shown[-2] == "  | " + "x" * 297 + "..."
    assert shown[0] == "  | early line 30" and "early line 29" not in tail
    assert "candidate.log" in tail.splitlines()[0]
    assert "\x1b" not in out
    assert "reference engine's" not in out  # the reference was healthy: no tail of its


def run_on_a_terminal(env: dict[str, str], *args: str) -> bytes:
    """`gate ARGS` with a pseudo-terminal as its stdout and stderr: what a person sees."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gate", *args], env=env, stdout=follower, stderr=follower
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=120)
    os.close(leader)
    return out


COLOUR = re.compile(rb"\x1b\[(?:[0-9;]*;)?(?:3[0-7]|9[0-7]|38;5;\d+)(?:;[0-9;]*)?m")


def test_colour_only_on_a_terminal_and_never_with_no_color(
    env: dict[str, str], tmp_path: Path
) -> None:
    spec = tmp_path / "dies.yaml"
    spec.write_text(DIES)
    env = {k: v for k, v in env.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    assert COLOUR.search(run_on_a_terminal(env, "run", str(spec)))  # a person's terminal
    plain = run_on_a_terminal({**env, "NO_COLOR": "1"}, "run", str(spec))
    assert b"HOLD" in plain and not COLOUR.search(plain)  # no-color.org: no colour at all
    piped = gate(env, "run", str(spec), timeout=120)
    assert "HOLD" in piped.stderr and "\x1b" not in piped.stderr  # not a terminal
