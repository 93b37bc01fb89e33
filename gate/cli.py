"""`gate`: run a gate from a spec, run the demo, migrate the database.

Exit codes: 0 continue, 1 hold, 2 the spec is invalid or the gate could not run (a hold too),
130 interrupted (the engines were torn down and the GPUs released first).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gate.core.errors import GateError, SpecError, TokenError
from gate.core.settings import Settings
from gate.core.threads import one_blas_thread
from gate.core.vocabulary import EXIT_ERROR, EXIT_INTERRUPTED
from gate.runs.console import ConsoleProgress, print_summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gate",
        description="Decide whether a candidate LLM engine image may keep rolling out.",
    )
    p.add_argument("--version", action="version", version=f"gate {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a gate from a spec file (YAML or JSON)")
    run.add_argument("spec", type=Path, help="the gate spec file")
    _common(run)

    demo = sub.add_parser("demo", help="run a gate on two local sim engines")
    demo.add_argument(
        "--clean", action="store_true", help="an identical candidate: expect continue"
    )
    _common(demo)

    _add_capacity(sub)

    mig = sub.add_parser("migrate", help="bring the database schema to the latest revision")
    mig.add_argument("--db", help="SQLAlchemy URL (default: GATE_DATABASE_URL or .gate/gate.db)")

    serve = sub.add_parser("serve", help="the REST API, report pages and /metrics (uvicorn)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080)")

    worker = sub.add_parser(
        "worker", help="a Celery worker that runs gates (needs GATE_BROKER_URL)"
    )
    worker.add_argument(
        "--concurrency", type=int, default=1, help="gates run at once by this worker (default 1)"
    )

    _add_token(sub)
    _add_calibrate(sub)
    return p


def _add_capacity(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cap = sub.add_parser(
        "capacity",
        help="how many whole gate shapes fit the inventory now, per topology domain",
    )
    cap.add_argument(
        "--inventory",
        type=Path,
        help="inventory YAML (default: the spec's `inventory` with --spec, else the local example)",
    )
    cap.add_argument(
        "--shape",
        default="",
        help="key=value pairs, e.g. sku=H200,gpus_per_engine=8 or "
        "sku=GB200,gpus_per_engine=16,nodes_per_engine=4,engine_level=clique; worker groups: "
        "groups=prefill:4+decode:8x2@clique,connect=prefill/decode@clique",
    )
    cap.add_argument("--spec", type=Path, help="take the shape from a gate spec instead")
    cap.add_argument("--db", help="subtract GPUs held by active gate reservations in this DB")
    cap.add_argument("--json", action="store_true", help="print the capacity document")


def _add_token(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tok = sub.add_parser("token", help="make, list or revoke API tokens (stored hashed)")
    tok_sub = tok.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    tok_create = tok_sub.add_parser("create", help="make a token; it is printed once")
    tok_create.add_argument("name", help="who or what uses it, e.g. argo-rollouts")
    tok_create.add_argument(
        "--scopes", default="read", help="comma-separated: read, run, admin (default read)"
    )
    tok_revoke = tok_sub.add_parser("revoke", help="revoke every token with this name")
    tok_revoke.add_argument("name")
    tok_list = tok_sub.add_parser(
        "list", help="the tokens: name, scopes, when made and last used (never a secret)"
    )
    tok_list.add_argument("--all", action="store_true", help="revoked tokens too")
    tok_list.add_argument("--json", action="store_true", help="print them as JSON")


def _add_calibrate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cal = sub.add_parser("calibrate", help="simulate gates: false-hold rate and power vs Kayenta")
    cal.add_argument("--runs", type=int, help="simulated gates per case (default 20)")
    cal.add_argument("--seed", type=int, default=0, help="seed of the simulation (default 0)")
    cal.add_argument("--limit", type=int, help="requests per arm at the limit (default 20000)")
    cal.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    cal.add_argument(
        "--engines",
        nargs="?",
        const="sim",
        choices=["sim", "vllm"],
        help="also run whole gates against real engine processes (--engine-runs per case): "
        "the sim (default), or real vLLM from the test bed (`--engines vllm`; `make vllm`)",
    )
    cal.add_argument(
        "--numerics-runs",
        type=int,
        default=200,
        help="simulated gates per numerics case: benign noise and bugs against a deterministic "
        "reference (default 200, ~0.05 s each; 0 skips them)",
    )
    cal.add_argument(
        "--engine-runs",
        type=int,
        default=3,
        help="real gates per engine case with --engines (default 3; ~30 s each)",
    )
    cal.add_argument(
        "--engine-rate",
        type=float,
        default=None,
        help="requests per second of each --engines gate (sim: default 40, a 20 s scenario; "
        "at more than about 50 its 808 requests are too short for the paired checks; vllm: "
        "default 2, what two servers and the gate on two cores serve)",
    )
    _add_calibrate_grid(cal)


def _add_calibrate_grid(cal: argparse.ArgumentParser) -> None:
    """`gate calibrate`: the cases, the grid and the shapes it simulates."""
    cal.add_argument(
        "--case",
        action="append",
        dest="cases",
        metavar="NAME",
        help="simulate only this case (repeatable; default: every case), e.g. --case A/A",
    )
    cal.add_argument(
        "--grid",
        action="store_true",
        help=(
            "simulate the dependence models (independent-like, mirrored, itl-like, heavy-batch) "
            "at planned sizes 500, 1000, 2000 and 20000 instead of the default engine"
        ),
    )
    cal.add_argument(
        "--shapes",
        action="store_true",
        help=(
            "judge v3's grid (issue 28): validity at the tolerance boundary under engine drift, "
            "long batches, heavy tails and error episodes, and power on regressions shaped like "
            "real ones (a slow share, a slow tail, a window, a stall, a creep, timeouts), at "
            "planned sizes 1000 and 2000, ours beside the Kayenta-style baseline"
        ),
    )
    cal.add_argument(
        "--markdown-from",
        type=Path,
        metavar="FILE",
        help="print the README's tables from a `gate calibrate --shapes --json` document",
    )
    cal.add_argument(
        "--aa-runs",
        type=int,
        help="with --grid or --shapes: gates per A/A and boundary cell (default: --runs)",
    )
    cal.add_argument(
        "--errors-size",
        type=lambda v: None if v in ("0", "none") else int(v),
        default=5_000,
        help="with --grid: planned size of the two errors cells (default 5000; 0: none)",
    )
    cal.add_argument(
        "--sizes",
        type=lambda v: [int(x) for x in v.split(",")],
        help=(
            "with --grid or --shapes: planned sizes, comma-separated (default 500,1000,2000,"
            "20000 for --grid, 1000,2000 for --shapes)"
        ),
    )


def _version() -> str:
    """The installed package's version (`pip install -e .` too); a bare source tree has none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llm-deploy-gate")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the verdict document on stdout")
    p.add_argument("--report-dir", type=Path, help="where to write the HTML report")
    p.add_argument("--db", help="SQLAlchemy URL (default: GATE_DATABASE_URL or .gate/gate.db)")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    one_blas_thread()  # gate/core/threads.py: engines share the host's cores
    if args.command == "calibrate":
        from gate.calibrate import run_calibration, run_grid, run_shapes

        if args.markdown_from is not None:
            from gate.calibrate import shapes_markdown

            print(shapes_markdown(json.loads(args.markdown_from.read_text())))
            return 0
        if args.shapes:
            return run_shapes(args.runs, args.aa_runs, args.seed, args.json, args.sizes)
        if args.grid:
            return run_grid(
                args.runs, args.aa_runs, args.seed, args.json, args.sizes, args.errors_size
            )

        if args.engines and args.engine_runs < 1:
            print("gate: --engine-runs must be at least 1", file=sys.stderr)
            return 2
        return run_calibration(
            args.runs,
            args.seed,
            args.json,
            args.limit,
            args.cases,
            args.engine_runs if args.engines else 0,
            args.engine_rate,
            args.numerics_runs,
            args.engines or "sim",
        )
    settings = Settings()
    if args.command == "serve":
        return _serve(settings, args.host, args.port)
    if args.command == "worker":
        from gate.worker.main import run_worker

        return run_worker(settings, concurrency=args.concurrency)
    if args.command == "token":
        return _token(settings, args)
    if args.command == "migrate":
        return _migrate(settings, args.db)
    if args.command == "capacity":
        return _capacity(settings, args)
    if args.command == "demo":
        from gate.demo import demo_spec

        spec = demo_spec(clean=args.clean)
        code = _run(spec, settings, args)
        return 0 if code in (0, 1) else code
    try:
        from gate.core.limits import Limits
        from gate.service.admission import command_line_url_problems
        from gate.spec import load_spec, spec_limit_problems

        spec = load_spec(args.spec)
        if problems := command_line_url_problems(spec, settings):
            raise SpecError(problems, str(args.spec))
        # The operator's caps bind a spec file as they bind one sent to the API.
        if over := spec_limit_problems(spec, Limits.from_settings(settings)):
            raise SpecError(over, str(args.spec))
        from gate.runs.schedules import plan_problems
        from gate.runs.workloads import WorkloadFiles

        files = WorkloadFiles.of(settings, confined=False)  # the operator's own command
        if short := plan_problems(spec, Limits.from_settings(settings), files):
            raise SpecError(short, str(args.spec))
    except SpecError as exc:
        return _spec_error(exc, args.json)
    return _run(spec, settings, args)


def _spec_error(exc: SpecError, as_json: bool) -> int:
    print(f"gate: {exc.message}", file=sys.stderr)
    if as_json:
        from gate.verdict import invalid_spec_document

        print(json.dumps(invalid_spec_document(exc).to_json(), indent=2))
    return EXIT_ERROR


def _run(spec: Any, settings: Settings, args: argparse.Namespace) -> int:
    from gate.engines.orphans import sweep_orphans
    from gate.runs.runner import GateRunner

    sweep_orphans()  # what a gate killed on this host left behind
    progress = ConsoleProgress()
    runner = GateRunner(
        spec, settings, report_dir=args.report_dir, db_url=args.db, progress=progress
    )

    async def _main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        await runner.run()

    progress.start(spec)
    try:
        asyncio.run(_main())
    except KeyboardInterrupt:
        pass  # the runner tore everything down and recorded the gate as cancelled
    except GateError as exc:  # raised before a gate row existed (e.g. the database)
        progress.stop()
        print(f"gate: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        progress.stop()
    outcome = runner.outcome
    if outcome is None:
        print("gate: interrupted before the gate was recorded", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_summary(outcome.doc)
    if args.json:
        print(json.dumps(outcome.document, indent=2, allow_nan=False))
    return outcome.exit_code


def _capacity(settings: Settings, args: argparse.Namespace) -> int:
    import time

    from gate.reservations.allocator import ShapeRequest
    from gate.reservations.inventory import load_inventory
    from gate.reservations.report import capacity_document, parse_shape
    from gate.runs.console import print_capacity

    try:
        inventory_path = args.inventory
        if args.spec:
            from gate.spec import load_spec

            spec = load_spec(args.spec)
            shape = spec.shape.request(("reference", "candidate"))
            inventory_path = inventory_path or spec.inventory
        else:
            shape = ShapeRequest(**parse_shape(args.shape))
        inventory = load_inventory(inventory_path or settings.inventory)
    except SpecError as exc:
        print(f"gate: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except (ValueError, TypeError) as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return EXIT_ERROR
    held: list[tuple[str, int]] = []
    if args.db:
        from gate.core.database import make_engine, make_sessionmaker, upgrade
        from gate.reservations.leases import active_leases

        engine = make_engine(args.db)
        upgrade(engine)
        held = [
            (lease.node, lease.gpu_index)
            for lease in active_leases(make_sessionmaker(engine))
            if lease.inventory == inventory.name
        ]
    t0 = time.perf_counter()
    doc = capacity_document(inventory, shape, held, 0.0)
    doc["elapsed_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_capacity(doc)
    return 0


def _serve(settings: Settings, host: str, port: int) -> int:
    import uvicorn

    from gate.api.app import create_app
    from gate.http.server import server_config
    from gate.worker.logs import configure_logging

    configure_logging()  # logfmt lines carrying the gate id, as the workers write them
    # The port is bound here, before anything is said or started: "serving on" is printed
    # only once it is true, and a busy port is one clear line and exit 2.
    try:
        sock = _listen(host, port)
    except OSError as exc:
        print(f"gate: cannot serve on {host}:{port}: {_bind_problem(exc, port)}", file=sys.stderr)
        return EXIT_ERROR
    app = create_app(settings)
    mode = f"Celery via {settings.broker_url}" if settings.broker_url else "in-process worker"
    where = f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}"
    print(f"gate: serving on {where} (API /v1, docs /v1/docs; gates run by {mode})", flush=True)
    config = server_config(app, settings, host, port)  # slow clients cut, connections capped
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening, as uvicorn binds one (SO_REUSEADDR: a
    restart does not wait out TIME_WAIT; on Linux it never lets two servers listen on one
    port). Listening at once, a client that connects after "serving on" waits in the backlog
    while the app starts, instead of being refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _bind_problem(exc: OSError, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} is already in use (another `gate serve`, or another program); "
            "stop it, or choose another port with --port"
        )
    if exc.errno == errno.EACCES:
        return f"not allowed to bind port {port} (ports below 1024 need privileges)"
    if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME) or isinstance(exc, socket.gaierror):
        return "no such address on this machine (--host takes one of its addresses, or 0.0.0.0)"
    return exc.strerror or str(exc)


def _token(settings: Settings, args: argparse.Namespace) -> int:
    from gate.access.tokens import create_token, revoke
    from gate.service.execution import open_factory

    factory = open_factory(settings)
    if args.token_command == "list":
        return _token_list(factory, args.all, args.json)
    if args.token_command == "revoke":
        n = revoke(factory, args.name)
        print(f"revoked {n} token(s) named {args.name!r}")
        return 0 if n else EXIT_ERROR
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    try:
        token = create_token(factory, args.name, scopes)
    except TokenError as exc:
        print(f"gate: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    print(token)
    print(f"(token {args.name!r} with scopes {','.join(scopes)}; shown once)", file=sys.stderr)
    return 0


def _token_list(factory: Any, revoked: bool, as_json: bool) -> int:
    from gate.access.tokens import list_tokens
    from gate.core.clock import utc_text

    rows = list_tokens(factory, revoked=revoked)
    if as_json:
        out = [
            {
                "id": t.id,
                "name": t.name,
                "scopes": t.scopes.split(","),
                "created_at": utc_text(t.created_at),
                "last_used_at": utc_text(t.last_used_at) if t.last_used_at else None,
                "revoked_at": utc_text(t.revoked_at) if t.revoked_at else None,
            }
            for t in rows
        ]
        print(json.dumps(out, indent=2))
        return 0
    if not rows:
        print("no tokens" + ("" if revoked else " (--all shows revoked ones)"), file=sys.stderr)
        return 0

    def when(t: Any) -> str:
        return "never" if t is None else utc_text(t)[:19].replace("T", " ") + " UTC"

    table = [("ID", "NAME", "SCOPES", "CREATED", "LAST USED", *(("REVOKED",) if revoked else ()))]
    for t in rows:
        extra = (when(t.revoked_at) if t.revoked_at else "-",) if revoked else ()
        table.append(
            (str(t.id), t.name, t.scopes, when(t.created_at), when(t.last_used_at), *extra)
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _migrate(settings: Settings, db: str | None) -> int:
    from gate.core.database import make_engine, upgrade

    url = db or settings.resolved_database_url()
    engine = make_engine(url)
    upgrade(engine)
    print(
        f"database at {engine.url.render_as_string(hide_password=True)} is at the latest revision"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
