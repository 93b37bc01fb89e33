"""One error family: every exception class of the gate lives in gate/core/errors.py, and every
GateError names its own `code` (the string the API, the CLI and the documents show)."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import gate
from gate.core import errors
from gate.core.errors import GateError

GATE = Path(gate.__file__).parent
HOME = GATE / "core" / "errors.py"
SKIPPED = (GATE / "engines" / "sim",)  # a standalone simulator with errors of its own


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(GATE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class _Source:
    """The gate's source read with ast: which classes each module defines, and which names it
    imports from where, so a base class can be followed without importing gate modules."""

    def __init__(self) -> None:
        self.classes: dict[str, dict[str, ast.ClassDef]] = {}  # module -> name -> top-level
        self.nested: dict[str, list[ast.ClassDef]] = {}  # classes inside functions or classes
        self.imports: dict[str, dict[str, str]] = {}  # module -> local name -> dotted target
        self.paths: dict[str, Path] = {}
        for path in sorted(GATE.rglob("*.py")):
            module = _module_name(path)
            self.paths[module] = path
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            top = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
            self.classes[module] = top
            self.nested[module] = [
                n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n not in top.values()
            ]
            self.imports[module] = self._imports(tree, module, path.name == "__init__.py")

    @staticmethod
    def _imports(tree: ast.Module, module: str, package: bool) -> dict[str, str]:
        names: dict[str, str] = {}
        for node in ast.walk(tree):  # TYPE_CHECKING and function-level imports too
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        names[a.asname] = a.name
                    else:
                        names[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = module.split(".")
                    anchor = here if package else here[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for a in node.names:
                    names[a.asname or a.name] = f"{base}.{a.name}"
        return names

    def is_exception(self, module: str, base: ast.expr, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `base`, written in `module`, is Exception or one of its subclasses."""
        if isinstance(base, ast.Name):
            return self._named(module, base.id, seen)
        if isinstance(base, ast.Attribute):
            dotted = ast.unparse(base)
            head, _, rest = dotted.partition(".")
            target = self.imports.get(module, {}).get(head)
            return self._dotted(f"{target}.{rest}" if target else dotted, seen)
        return False  # a call or a subscript (Generic[...]): not an exception class

    def _named(self, module: str, name: str, seen: frozenset[str]) -> bool:
        key = f"{module}.{name}"
        if key in seen:
            return False
        seen = seen | {key}
        if name in self.classes.get(module, {}):
            node = self.classes[module][name]
            return any(self.is_exception(module, b, seen) for b in node.bases)
        if name in self.imports.get(module, {}):
            return self._dotted(self.imports[module][name], seen)
        value = getattr(builtins, name, None)
        return isinstance(value, type) and issubclass(value, Exception)

    def _dotted(self, dotted: str, seen: frozenset[str]) -> bool:
        module, _, name = dotted.rpartition(".")
        if module == "gate" or module.startswith("gate."):
            if module in self.classes:
                return self._named(module, name, seen)
            return False  # a gate module, not a class in one
        try:  # a library's class: import the library (never a gate module) and ask it
            value = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            try:
                value = importlib.import_module(dotted)  # `import x.y` then `x.y` is a module
            except ImportError:
                return False
        return isinstance(value, type) and issubclass(value, Exception)

    def strays(self) -> list[str]:
        """Every public exception class defined outside gate/core/errors.py."""
        out = []
        for module, path in self.paths.items():
            if path == HOME or any(path.is_relative_to(s) for s in SKIPPED):
                continue
            nodes = [*self.classes[module].values(), *self.nested[module]]
            for node in nodes:
                if node.name.startswith("_"):
                    continue
                if any(self.is_exception(module, b) for b in node.bases):
                    out.append(f"{path.relative_to(GATE.parent)}:{node.lineno} {node.name}")
        return sorted(out)


def test_every_exception_class_lives_in_core_errors() -> None:
    strays = _Source().strays()
    assert strays == [], "exception classes outside gate/core/errors.py:\n" + "\n".join(strays)


def test_the_walk_finds_what_it_is_meant_to() -> None:
    """The walk itself: it knows the family in errors.py when it is not told to skip it."""
    source = _Source()
    found = {
        name
        for name, node in source.classes["gate.core.errors"].items()
        if any(source.is_exception("gate.core.errors", b) for b in node.bases)
    }
    assert {"GateError", "SpecError", "EngineUnreachable", "UrlRefused", "TooManyGates"} <= found
    assert "FieldProblem" not in found


def _family() -> set[type[GateError]]:
    out: set[type[GateError]] = set()
    todo = [GateError]
    while todo:
        cls = todo.pop()
        out.add(cls)
        todo.extend(cls.__subclasses__())
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, GateError):
            out.add(value)
    return out


def test_every_gate_error_has_its_own_code() -> None:
    """A class that declares a `code` owns it: no two classes declare the same one. A subclass
    that declares none (BlockedReservation, TooManyGates) is a case of its parent and answers
    with the parent's code."""
    owners: dict[str, list[str]] = {}
    for cls in _family():
        if "code" in vars(cls):
            owners.setdefault(cls.code, []).append(cls.__qualname__)
    shared = {code: sorted(names) for code, names in owners.items() if len(names) > 1}
    assert shared == {}
    for cls in _family():
        assert isinstance(cls.code, str) and cls.code
        assert isinstance(cls.status_code, int) and 400 <= cls.status_code < 600


def test_moved_names_stay_importable_from_their_old_modules() -> None:
    """Code that imported an error from where it used to live keeps working."""
    from gate.access import network, tokens
    from gate.api import gates
    from gate.engines import kubernetes
    from gate.reservations import leases

    assert gates.TooBusy is errors.TooBusy
    assert tokens.TokenError is errors.TokenError
    assert kubernetes.ClusterError is errors.ClusterError
    assert leases.BlockedReservation is errors.BlockedReservation
    assert network.UrlRefused is errors.UrlRefused


def test_url_refused_is_still_a_value_error() -> None:
    exc = errors.UrlRefused("must not have a fragment")
    assert isinstance(exc, ValueError) and isinstance(exc, GateError)
    assert str(exc) == exc.message == "must not have a fragment"
    assert (exc.status_code, exc.code) == (422, "url_refused")
