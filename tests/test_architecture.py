"""The shape of the code, checked from the source with `ast`.

Why: a cycle between packages means neither can be read, tested or changed alone, and queries
written in endpoints spread the schema into the HTTP layer. Both creep in one import at a time,
so a test names the offender the day it appears (docs/architecture.md, "Boundaries").
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "gate"

# What an HTTP layer must not import: it calls service functions, which open the session.
FORBIDDEN_IN_HTTP = ("sqlalchemy", "gate.models", "gate.core.database", "gate.service.repository")
SESSION_CALLS = {"execute", "scalar", "scalars", "get", "query", "add", "delete", "merge", "flush"}
HTTP_LAYERS = ("api", "web")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, in functions too, except those under `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imported_modules(path: Path) -> Iterator[tuple[str, ast.Import | ast.ImportFrom]]:
    module = _module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        else:
            base = _absolute(node, module, path.name == "__init__.py")
            yield base, node
            for alias in node.names:
                yield f"{base}.{alias.name}", node


def _node(module: str) -> str | None:
    """`gate.<first part>`: a package, or a top-level module (gate/cli.py is `gate.cli`)."""
    parts = module.split(".")
    if parts[0] != "gate" or len(parts) < 2:
        return None
    first = parts[1]
    if (GATE / first).is_dir() or (GATE / f"{first}.py").is_file():
        return f"gate.{first}"
    return None


def package_graph() -> dict[str, dict[str, set[str]]]:
    """node -> imported node -> the files that make the edge (for the failure message)."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in sorted(GATE.rglob("*.py")):
        src = _node(_module_name(path))
        if src is None:
            continue
        edges = graph.setdefault(src, {})
        for imported, _ in _imported_modules(path):
            dst = _node(imported)
            if dst is not None and dst != src:
                edges.setdefault(dst, set()).add(str(path.relative_to(ROOT)))
    return graph


def find_cycle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_cycles_between_gate_packages() -> None:
    graph = package_graph()
    assert "gate.web" in graph["gate.api"]  # seen: an import inside a function (create_app)
    cycle = find_cycle(graph)
    if cycle:
        steps = [
            f"  {a} -> {b} ({', '.join(sorted(graph[a][b]))})" for a, b in itertools.pairwise(cycle)
        ]
        raise AssertionError("import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(steps))


def test_http_layers_build_no_queries() -> None:
    """gate/api and gate/web call service functions; they never touch the ORM, nor the
    service's repository (its queries run inside the service's transactions)."""
    offences = []
    for layer in HTTP_LAYERS:
        for path in sorted((GATE / layer).rglob("*.py")):
            rel = path.relative_to(ROOT)
            for imported, node in _imported_modules(path):
                if any(imported == m or imported.startswith(m + ".") for m in FORBIDDEN_IN_HTTP):
                    offences.append(f"{rel}:{node.lineno} imports {imported}")
            tree = ast.parse(path.read_text())
            for call in ast.walk(tree):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr in SESSION_CALLS
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id in {"s", "session", "db"}
                ):
                    offences.append(
                        f"{rel}:{call.lineno} calls {call.func.value.id}.{call.func.attr}()"
                    )
    assert not offences, "queries belong in gate/service/repository.py:\n" + "\n".join(offences)


def test_find_cycle_names_the_loop() -> None:
    graph = {"a": {"b": {"x"}}, "b": {"c": {"y"}}, "c": {"a": {"z"}}, "d": {"a": {"w"}}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": {"x"}}, "b": {}}) is None


def test_type_checking_imports_are_not_edges() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import gate.web\n"
        "def f():\n    import gate.runs\n"
    )
    names = [a.name for node in _imports(tree) for a in node.names]
    assert "gate.web" not in names and "gate.runs" in names


# -- the gate run's room (issue 15): a state machine over stages, the ORM behind one module ----

RUNS = GATE / "runs"
SERVICE = GATE / "service"
RUNNER_MAX_LINES = 300
FUNCTION_MAX_LINES = 60
ORM_ONLY_IN = {"rows.py"}  # of gate/runs: the one module that writes the run's rows


def _functions(path: Path) -> Iterator[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            yield node.name, node.end_lineno - node.lineno + 1


def test_the_runner_is_a_small_state_machine() -> None:
    lines = len((RUNS / "runner.py").read_text().splitlines())
    assert lines < RUNNER_MAX_LINES, f"gate/runs/runner.py has {lines} lines"


def _longer_than(limit: int, paths: Iterable[Path]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}::{name} ({n} lines)"
        for path in paths
        for name, n in _functions(path)
        if n > limit
    ]


def test_no_function_in_gate_runs_or_the_service_is_longer_than_a_screen() -> None:
    paths = [*sorted(RUNS.glob("*.py")), *sorted(SERVICE.glob("*.py"))]
    long = _longer_than(FUNCTION_MAX_LINES, paths)
    assert not long, f"functions over {FUNCTION_MAX_LINES} lines:\n" + "\n".join(long)


def test_only_the_store_of_gate_runs_touches_the_orm() -> None:
    offences = []
    for path in sorted(RUNS.glob("*.py")):
        if path.name in ORM_ONLY_IN:
            continue
        for imported, node in _imported_modules(path):
            if imported == "gate.models" or imported.startswith("gate.models."):
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {imported}")
            if imported == "sqlalchemy" or (
                imported.startswith("sqlalchemy.") and not imported.startswith("sqlalchemy.orm")
            ):
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {imported}")
    assert not offences, "persistence goes through gate/runs/rows.py:\n" + "\n".join(offences)


# -- the gate service apart from the pipeline (issue 31) ---------------------------------------

# The session calls that run queries: gate/service/repository.py's alone.
QUERY_CALLS = {"execute", "scalar", "scalars", "query"}


def test_the_pipeline_does_not_import_the_service() -> None:
    """gate/runs runs one gate wherever it is asked to; the service (gate/service) drives it.
    The other way round would make the pipeline untestable without the service's database
    rules, and bring back the one room of two packages issue 31 split."""
    offences = [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {imported}"
        for path in sorted(RUNS.rglob("*.py"))
        for imported, node in _imported_modules(path)
        if imported == "gate.service" or imported.startswith("gate.service.")
    ]
    assert not offences, "gate/runs must not import gate/service:\n" + "\n".join(offences)


def test_only_the_repository_of_the_service_builds_queries() -> None:
    """The service's rules (service.py) and its machinery (dispatch, execution, reapers) ask
    gate/service/repository.py; none of them writes a query of its own."""
    offences = []
    for path in sorted(SERVICE.glob("*.py")):
        if path.name == "repository.py":
            continue
        rel = path.relative_to(ROOT)
        for imported, node in _imported_modules(path):
            if imported == "sqlalchemy" or (
                imported.startswith("sqlalchemy.") and imported.split(".")[1] not in ("orm", "exc")
            ):
                offences.append(f"{rel}:{node.lineno} imports {imported}")
        for call in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in QUERY_CALLS
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in {"s", "session", "db"}
            ):
                offences.append(
                    f"{rel}:{call.lineno} calls {call.func.value.id}.{call.func.attr}()"
                )
    assert not offences, "queries belong in gate/service/repository.py:\n" + "\n".join(offences)


def test_the_function_size_rule_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_MAX_LINES))
    path = tmp_path / "m.py"
    path.write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    assert dict(_functions(path)) == {"long": FUNCTION_MAX_LINES + 1, "short": 2}


# -- the sim engine (issue 31): a product of its own, beside the gate, never inside it ---------

SIMENGINE = ROOT / "simengine"


def _imports_of(package: Path, forbidden: str) -> list[str]:
    """`file:line imports name` for every import of `forbidden` (or below it) in `package`."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {imported}"
        for path in sorted(package.rglob("*.py"))
        for imported, node in _imported_modules(path)
        if imported == forbidden or imported.startswith(forbidden + ".")
    ]


def test_simengine_imports_nothing_from_the_gate() -> None:
    assert any(SIMENGINE.rglob("*.py")), "simengine/ moved: update this rule"
    offences = _imports_of(SIMENGINE, "gate")
    assert not offences, "simengine stands alone:\n" + "\n".join(offences)


def test_the_gate_and_loadgen_start_the_sim_only_as_a_process() -> None:
    """`python -m simengine` in an argv, never an import: the gate runs any engine the same way."""
    offences = _imports_of(GATE, "simengine") + _imports_of(ROOT / "loadgen", "simengine")
    assert not offences, "start the sim as a process:\n" + "\n".join(offences)


# -- the floor and the registries (issue 31) ---------------------------------------------------

CORE = GATE / "core"
KIND_NAMES = {"command", "preset", "url", "kubernetes", "groups"}
KINDS_MODULE = GATE / "spec" / "kinds.py"


def test_gate_core_imports_nothing_above_it() -> None:
    """gate/core is the floor (settings, errors, limits, the database): every other package
    may import it, so it imports none of them, nor loadgen, not even for an annotation."""
    offences = []
    for path in sorted(CORE.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):  # every import, TYPE_CHECKING ones and in functions too
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [_absolute(node, module, path.name == "__init__.py")]
            else:
                continue
            for name in names:
                parts = name.split(".")
                above = parts[0] == "loadgen" or (
                    parts[0] == "gate" and len(parts) > 1 and parts[1] != "core"
                )
                if above:
                    offences.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offences, "gate/core imports upward:\n" + "\n".join(offences)


def _lists_kinds(node: ast.AST) -> bool:
    """A tuple, list or set literal naming two or more engine kinds."""
    if not isinstance(node, ast.Tuple | ast.List | ast.Set):
        return False
    names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
    return len(names & KIND_NAMES) >= 2


def test_engine_kinds_are_listed_in_one_registry() -> None:
    """A new engine kind is one entry in ENGINE_KINDS (gate/spec/kinds.py): no other module
    keeps its own list of the kinds to infer, check or describe them by."""
    offences = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(GATE.rglob("*.py"))
        if path != KINDS_MODULE
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if _lists_kinds(node)
    ]
    assert not offences, "engine kinds listed outside gate/spec/kinds.py:\n" + "\n".join(offences)


# -- function size beyond the pipeline (issue 31): no function over 80 lines ----------------

LONG_FUNCTION_LINES = 80
SIZED_PACKAGES = (GATE, ROOT / "loadgen", ROOT / "simengine")  # the whole product


def test_no_function_anywhere_is_longer_than_80_lines() -> None:
    """The whole product, the sim and the split rooms (spec, suite, core) included."""
    paths = [path for package in SIZED_PACKAGES for path in sorted(package.rglob("*.py"))]
    long = _longer_than(LONG_FUNCTION_LINES, paths)
    assert not long, f"functions over {LONG_FUNCTION_LINES} lines:\n" + "\n".join(long)


# -- module size (issue 31): no module over 700 lines ------------------------------------------

LONG_MODULE_LINES = 700


def test_no_module_is_longer_than_700_lines() -> None:
    """A module past 700 lines holds more than one concern: split it along them (the file
    names then say what each part does), as gate/reservations/groups.py and loadgen/transport.py
    were."""
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for package in SIZED_PACKAGES
        for path in sorted(package.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > LONG_MODULE_LINES
    ]
    assert not long, f"modules over {LONG_MODULE_LINES} lines:\n" + "\n".join(long)
