"""Benchmark: the verdict endpoint under 200 concurrent pollers.

Starts the real service (`gate serve`: uvicorn, SQLite, token auth) with one finished gate
(its verdict is answered from the finished-verdict cache after the first read) and one running
gate (every poll reads the database: what pollers see for the whole length of a gate), and, in
the same run, a peer: a bare uvicorn + Starlette app answering the same JSON object
from memory, with no auth and no database (the floor of this stack on this machine). The same
client drives both:

- paced: 200 pollers, each polling every --interval seconds (Argo polls every 30 s; 1 s is a
  30x margin), for --duration seconds: latency p50/p90/p99 and errors;
- saturated: 200 pollers polling back to back: requests/s, latency p50/p99.

    .venv/bin/python bench/api_bench.py [--pollers 200] [--duration 15] [--interval 1] [--json]

Client and servers share this machine's cores: the ratio to the peer is the comparable figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

PEER = textwrap.dedent(
    """
    import json, sys, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route
    BODY = json.dumps(json.loads(sys.argv[2])).encode()
    async def verdict(request):
        return Response(BODY, media_type="application/json")
    app = Starlette(routes=[Route("/v1/gates/{gid}/verdict", verdict)])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> None:
    """Until `url` answers; a server that exits or never answers is reported with the end of
    its log (a port taken between `free_port` and its bind, an import error). The timeout is
    generous: on a busy host the gate's imports alone can take tens of seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.HTTPError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    said = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    state = f"exited {proc.returncode}" if proc.poll() is not None else f"silent {timeout:g} s"
    raise SystemExit(f"server at {url} did not start ({state}):\n{said}")


def seed(data_dir: Path) -> tuple[str, str, str, dict[str, Any]]:
    """A finished gate, a running one and a read token in the service's database."""
    from gate.access.tokens import create_token
    from gate.core.clock import now
    from gate.core.database import transaction
    from gate.core.settings import Settings
    from gate.models import GateRun
    from gate.service import service
    from gate.service.execution import open_factory
    from gate.spec import parse_spec

    settings = Settings(data_dir=data_dir)
    factory = open_factory(settings)
    spec = parse_spec(
        {
            "name": "bench",
            "model": "m",
            "reference": {"url": "http://127.0.0.1:9"},
            "candidate": {"url": "http://127.0.0.1:10"},
            "scenarios": [{"name": "s", "rate": 1, "requests": 1}],
        }
    )
    run, _ = service.create_gate(factory, spec)
    with transaction(factory) as s:
        row = s.get(GateRun, run.id)
        assert row is not None
        row.state, row.verdict, row.phase = "complete", "hold", "finished"
        row.reason = "TTFT p50 in steady is 1.42x the reference (interval 1.40x-1.44x)."
        summary = service.verdict_summary(row, settings.public_url).model_dump(mode="json")
    running, _ = service.create_gate(factory, spec.model_copy(update={"name": "bench-running"}))
    with transaction(factory) as s:
        row = s.get(GateRun, running.id)
        assert row is not None
        row.state, row.phase, row.worker = "running", "scenario:steady", "bench"
        row.heartbeat_at = now()  # the service runs with GATE_LOST_AFTER_S of an hour
        row.progress = {"scenario": "steady", "done": 100, "total": 1000}
    token = create_token(factory, "bench", ["read"])
    return run.id, running.id, token, summary


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bool:
    """One keep-alive HTTP/1.1 GET on an open connection; True on a 200 with its body read."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status == 200


async def pollers(
    url: str, headers: dict[str, str], n: int, duration: float, interval: float
) -> tuple[np.ndarray, int, float]:
    """`n` pollers, each on its own keep-alive connection. The client is a few lines of
    asyncio streams rather than httpx: at 200 pollers httpx's own CPU on these two cores was
    the limit (about 185 req/s), for the peer as for the service, which hid both."""
    u = httpx.URL(url)
    lines = [f"GET {u.raw_path.decode()} HTTP/1.1", f"Host: {u.host}:{u.port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    lat: list[float] = []
    errors = 0
    stop = time.monotonic() + duration

    async def one(k: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(u.host, u.port)
        try:
            if interval > 0:
                await asyncio.sleep(interval * k / n)  # spread the first polls
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    ok = await _get(reader, writer, request)
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    ok = False
                    writer.close()
                    reader, writer = await asyncio.open_connection(u.host, u.port)
                dt = time.perf_counter() - t0
                if ok:
                    lat.append(dt * 1000)
                else:
                    errors += 1
                if interval > 0:
                    await asyncio.sleep(max(0.0, interval - dt))
        finally:
            writer.close()

    t0 = time.monotonic()
    await asyncio.gather(*(one(k) for k in range(n)))
    elapsed = time.monotonic() - t0
    return np.asarray(lat), errors, elapsed


def figures(lat: np.ndarray, errors: int, elapsed: float) -> dict[str, float]:
    if lat.size == 0:
        return {"requests": 0, "errors": errors}
    p50, p90, p99 = np.percentile(lat, [50, 90, 99])
    return {
        "requests": int(lat.size),
        "errors": errors,
        "rps": round(lat.size / elapsed, 1),
        "p50_ms": round(float(p50), 2),
        "p90_ms": round(float(p90), 2),
        "p99_ms": round(float(p99), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pollers", type=int, default=200)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--only", choices=["gate", "running"], action="append", help="measure only these (+ peer)"
    )
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gate-api-bench-"))
    gid, running_id, token, summary = seed(tmp)
    ours_port, peer_port = free_port(), free_port()
    env = {**os.environ, "GATE_DATA_DIR": str(tmp), "GATE_LOST_AFTER_S": "3600"}
    logs = [tmp / "serve.log", tmp / "peer.log"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gate", "serve", "--port", str(ours_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=logs[0].open("wb"),
        ),
        subprocess.Popen(
            [sys.executable, "-c", PEER, str(peer_port), json.dumps(summary)],
            stdout=subprocess.DEVNULL,
            stderr=logs[1].open("wb"),
        ),
    ]
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        targets = {
            "gate": (
                f"http://127.0.0.1:{ours_port}/v1/gates/{gid}/verdict",
                {"Authorization": f"Bearer {token}"},
            ),
            "running": (
                f"http://127.0.0.1:{ours_port}/v1/gates/{running_id}/verdict",
                {"Authorization": f"Bearer {token}"},
            ),
            "peer": (f"http://127.0.0.1:{peer_port}/v1/gates/{gid}/verdict", {}),
        }
        for name, (url, headers) in targets.items():
            at = 1 if name == "peer" else 0
            wait_up(url.rsplit("/v1", 1)[0] + "/v1/gates/x/verdict", procs[at], logs[at])
            r = httpx.get(url, headers=headers)
            want = "running" if name == "running" else "complete"
            assert r.status_code == 200 and r.json()["state"] == want, r.text
        for mode, interval in (("paced", args.interval), ("saturated", 0.0)):
            for name, (url, headers) in targets.items():
                if args.only and name not in args.only and name != "peer":
                    continue
                print(
                    f"-- {mode}: {args.pollers} pollers on {name} for {args.duration:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
                lat, errors, elapsed = asyncio.run(
                    pollers(url, headers, args.pollers, args.duration, interval)
                )
                results.setdefault(mode, {})[name] = figures(lat, errors, elapsed)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    ratio = {
        f"{mode}/{name}": {
            "p50": round(r[name]["p50_ms"] / r["peer"]["p50_ms"], 2),
            "p99": round(r[name]["p99_ms"] / r["peer"]["p99_ms"], 2),
            "rps": round(r[name]["rps"] / r["peer"]["rps"], 2),
        }
        for mode, r in results.items()
        for name in ("gate", "running")
        if name in r
    }
    out = {
        "pollers": args.pollers,
        "duration_s": args.duration,
        "results": results,
        "gate_over_peer": ratio,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"verdict endpoint, {args.pollers} concurrent pollers, {args.duration:.0f}s per run")
    print("gate: a finished gate; running: a running gate (database read per poll)")
    print(
        f"{'mode':<10} {'server':<8} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}"
        f" {'errors':>7}"
    )
    for mode, r in results.items():
        for name, f in r.items():
            print(
                f"{mode:<10} {name:<8} {f.get('rps', 0):>8} {f.get('p50_ms', 0):>8}"
                f" {f.get('p90_ms', 0):>8} {f.get('p99_ms', 0):>8} {f['errors']:>7}"
            )
        for name in ("gate", "running"):
            if f"{mode}/{name}" not in ratio:
                continue
            q = ratio[f"{mode}/{name}"]
            print(f"{mode:<10} {name}/peer: p50 {q['p50']}x, p99 {q['p99']}x, req/s {q['rps']}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
