"""docs/architecture.md names only modules that exist (issue 31): a newcomer reads it to find
where a concern lives, so a path it names that a move left behind is a wrong turn. Checked
from the text alone, without importing anything:

- every path from the repository's root (`gate/runs/runner.py`, `loadgen/transport.py`,
  `gate/runs/`, `tests/test_architecture.py`, `bench/vllm/setup`, `gate/calibrate*.py` as a
  glob) is a file or folder;
- every shorter path (`runs/probes.py`, `sim/README.md`) and every bare module file
  (`store.py`) is a file somewhere under a top-level package;
- in the maps of "Where each concern lives", every file and folder a folder's lines list is in
  that folder (`gate/core/  settings.py (...), errors.py (...)`, `bench/  ... vllm/`);
- every dotted name of a package (`gate.service.service.create_gate`, `loadgen.schedule`) is a
  module, then a name that module defines or imports (`create_gate`), but for the few dotted
  words that are no module (a check id, a Celery task, a label).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
# Folders of the repository a path may start from; the top-level packages are found.
TOP_FOLDERS = ("bench", "docs", "examples", "migrations", "tests")
# Dotted words of the doc that name no module: a check id, the Celery task, a label's domain.
NOT_MODULES = {"gate.environment", "gate.run", "gate.dev"}

ROOTED = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+[\w*.-]*[\w*/])")
MODULE_FILE = re.compile(r"(?<![\w./-])(\w+\.(?:py|md))\b")
DOTTED = re.compile(r"(?<![\w./-])([a-z_]\w*(?:\.[A-Za-z_]\w*)+)\b")


def packages() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))


def exists(path: str) -> bool:
    return any(ROOT.glob(path.rstrip("/"))) if "*" in path else (ROOT / path).exists()


def somewhere(path: str) -> bool:
    """`runs/probes.py` or `store.py`: a file of that path under a top-level package."""
    return any(any((ROOT / pkg).glob(f"**/{path}")) for pkg in packages())


def rooted_paths(text: str) -> list[str]:
    starts = (*packages(), *TOP_FOLDERS)
    return [p for p in ROOTED.findall(text) if p.split("/")[0] in starts]


def relative_paths(text: str) -> list[str]:
    """Paths that start below the root: `runs/probes.py`, `sim/README.md`."""
    starts = (*packages(), *TOP_FOLDERS)
    return [
        p
        for p in ROOTED.findall(text)
        if p.split("/")[0] not in starts and p.endswith((".py", ".md"))
    ]


def concern_map(text: str) -> dict[str, list[str]]:
    """{folder: the files and folders its lines list} of the map under "Where each concern
    lives": a line that starts with a path opens a folder; indented lines go on with it."""
    start = text.index("## Where each concern lives")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```\n(.*?)```", text[start : end if end != -1 else None], re.S)
    assert blocks, "the map of where each concern lives is fenced blocks"
    listed: dict[str, list[str]] = {}
    folder = None
    for line in "\n".join(blocks).splitlines():
        if line and not line[0].isspace():
            head, _, line = line.partition(" ")
            folder = head if head.endswith("/") else None  # `gate/spec.py  ...`: a file
            if folder is not None:
                listed.setdefault(folder, [])
        if folder is None:
            continue
        prose = re.sub(r"`[^`]*`", "", line)  # quoted commands are not file names
        listed[folder] += re.findall(r"(?<![\w./-])(\w+\.py|\w+/)(?![\w/])", prose)
    return listed


@cache
def defined_names(module: Path) -> frozenset[str]:
    """What a module defines or imports at its top level (or a package's `__init__.py`)."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return frozenset(names)


def dotted_problem(name: str) -> str | None:
    """Why `gate.service.service.create_gate` names nothing, or None: its longest prefix that is a
    module or package, then at most one name that module defines."""
    parts = name.split(".")
    path = ROOT / parts[0]
    i = 1
    while i < len(parts):
        if (path / parts[i]).is_dir():
            path = path / parts[i]
        elif (path / f"{parts[i]}.py").is_file():
            path = path / f"{parts[i]}.py"
        else:
            break
        i += 1
    if i == 1:
        return f"{'.'.join(parts[:2])} is no module of {parts[0]}"
    rest = parts[i:]
    if not rest:
        return None
    module = path / "__init__.py" if path.is_dir() else path
    if len(rest) > 1 or not module.is_file() or rest[0] not in defined_names(module):
        return f"{'.'.join(parts[:i])} defines no {rest[0]}"
    return None


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text(encoding="utf-8")


def test_every_path_from_the_root_exists(text: str) -> None:
    paths = rooted_paths(text)
    assert len(paths) > 40, "the doc names the modules it describes by path"
    missing = sorted({p for p in paths if not exists(p)})
    assert missing == [], f"{DOC.name} names paths that do not exist: {missing}"


def test_every_shorter_path_and_module_file_exists(text: str) -> None:
    names = relative_paths(text) + MODULE_FILE.findall(text)
    assert len(names) > 20
    missing = sorted({n for n in names if not somewhere(n)})
    assert missing == [], f"{DOC.name} names files found under no package: {missing}"


def test_the_map_lists_files_that_are_in_their_folders(text: str) -> None:
    listed = concern_map(text)
    assert "gate/core/" in listed and "settings.py" in listed["gate/core/"]
    missing = sorted(
        f"{folder}{name}"
        for folder, names in listed.items()
        for name in names
        if not (ROOT / folder / name).exists()
    )
    assert missing == [], f"{DOC.name}'s map lists what its folder lacks: {missing}"


def test_every_dotted_module_name_resolves(text: str) -> None:
    names = {n for n in DOTTED.findall(text) if n.split(".")[0] in packages()}
    assert len(names) > 5
    problems = sorted(p for n in names - NOT_MODULES if (p := dotted_problem(n)))
    assert problems == [], f"{DOC.name} names modules or names that do not exist: {problems}"


def test_the_checks_catch_a_moved_module() -> None:
    """What a move leaves behind fails: a path, a bare file, a map entry, a dotted name."""
    assert not exists("gate/runs/no_such_module.py")
    assert not somewhere("runs/no_such_module.py") and not somewhere("no_such_module.py")
    moved = "```\ngate/core/          settings.py (typed), gone.py (moved), gone/\n```\n"
    listed = concern_map("## Where each concern lives\n\n" + moved)
    assert listed == {"gate/core/": ["settings.py", "gone.py", "gone/"]}
    assert dotted_problem("gate.runs.no_such_module") is not None
    assert dotted_problem("gate.core.settings.NoSuchName") is not None
    assert dotted_problem("gate.core.settings.Settings") is None
    assert dotted_problem("gate.no_such_package") is not None
