"""psrv's import graph, read from the source tree through pyproject's package-dir mapping.

Import-graph tools cannot follow ``[tool.setuptools.package-dir]`` (``psrv.transport`` lives in
``transport/``, ``psrv.spark.driver`` in ``spark/driver/``), so this module maps every file to its
module name itself, parses it with ``ast`` and resolves each import to the psrv module or package it
reaches. ``test_import_contract.py`` checks the layering rules on the result.
"""

from __future__ import annotations

import ast
import io
import tokenize
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "ROOT",
    "Import",
    "Mapping",
    "Module",
    "Source",
    "read_mapping",
    "read_source",
    "strongly_connected",
]

ROOT = Path(__file__).resolve().parents[2]

#: where an import statement stands: at module level, inside a function, or under ``if TYPE_CHECKING:``;
#: DYNAMIC: a module named by a string in a module that imports by name (``importlib.import_module``)
MODULE_LEVEL, FUNCTION_LEVEL, TYPE_CHECKING_ONLY, DYNAMIC = "module", "function", "type-checking", "dynamic"
_IMPORT_BY_NAME = ("import_module", "__import__")


@dataclass(frozen=True)
class Mapping:
    """``[tool.setuptools]``: the packages listed and the folder each one is mapped to."""

    packages: tuple[str, ...]
    dirs: dict[str, Path]


@dataclass(frozen=True)
class Module:
    """One .py file of a mapped package: its dotted name and whether it is the package's ``__init__``."""

    name: str
    path: Path
    is_package: bool
    rel: str

    @property
    def package(self) -> str:
        """The package this module belongs to (a package's ``__init__`` belongs to the package itself)."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Import:
    """One resolved edge: ``source`` imports ``target`` (a psrv module or package) at ``line``."""

    source: Module
    target: str
    line: int
    where: str
    lazy_comment: bool
    text: str

    @property
    def at(self) -> str:
        return f"{self.source.rel}:{self.line}"


@dataclass
class Source:
    """Every mapped module and every psrv import in them."""

    mapping: Mapping
    modules: dict[str, Module]
    imports: list[Import] = field(default_factory=list)

    def edges(self, *, type_checking: bool = True) -> Iterator[Import]:
        """Edges between two different modules; type-only imports (which never run) when asked for."""
        for imp in self.imports:
            if imp.target != imp.source.name and (type_checking or imp.where != TYPE_CHECKING_ONLY):
                yield imp

    def package_of(self, name: str) -> str:
        return self.modules[name].package


def read_mapping(root: Path = ROOT) -> Mapping:
    with (root / "pyproject.toml").open("rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    dirs = {name: root / folder for name, folder in setuptools.get("package-dir", {}).items()}
    return Mapping(tuple(setuptools.get("packages", ())), dirs)


def read_source(root: Path = ROOT) -> Source:
    """Find every module of every mapped package (each package's own folder, not its subfolders)."""
    mapping = read_mapping(root)
    modules: dict[str, Module] = {}
    for package, folder in mapping.dirs.items():
        for path in sorted(folder.glob("*.py")):
            is_package = path.stem == "__init__"
            name = package if is_package else f"{package}.{path.stem}"
            modules[name] = Module(name, path, is_package, path.relative_to(root).as_posix())
    source = Source(mapping, modules)
    for module in modules.values():
        source.imports.extend(_imports_of(module, modules))
    return source


def _imports_by_name(tree: ast.Module) -> list[int]:
    """Lines that import a module by name at run time (``importlib.import_module(x)``, ``__import__(x)``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = getattr(func, "attr", None) or getattr(func, "id", "")
            if name in _IMPORT_BY_NAME:
                lines.append(node.lineno)
    return lines


def _lazy_lines(text: str) -> set[int]:
    """Lines that carry a ``# lazy:`` comment (as code's trailing comment or on a line of their own)."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and tok.string.lstrip("#").strip().startswith("lazy:"):
            lines.add(tok.start[0])
    return lines


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(body: Iterable[ast.stmt], where: str) -> Iterator[tuple[ast.stmt, str]]:
    """Every import statement and where it stands (everything inside a function is function-level)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, where
            continue
        inner = where
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner = FUNCTION_LEVEL
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and where == MODULE_LEVEL:
            yield from _statements(node.body, TYPE_CHECKING_ONLY)
            yield from _statements(node.orelse, where)
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _statements([child], inner)
            elif isinstance(child, ast.excepthandler | ast.match_case):
                yield from _statements(child.body, inner)


def _known(name: str, modules: dict[str, Module]) -> str | None:
    """The longest prefix of ``name`` that is a mapped module or package (``psrv.a.b.C`` -> ``psrv.a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: Module, modules: dict[str, Module]) -> set[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names if alias.name.split(".")[0] == "psrv"]
        return {t for t in (_known(n, modules) for n in names) if t}
    base = node.module or ""
    if node.level:  # relative: level 1 is the importer's own package
        anchor = module.package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    if base.split(".")[0] != "psrv":
        return set()
    found = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        # ``from psrv.spark import storage`` reaches the module; ``from psrv.spark import SparkNetwork``
        # reaches the package
        target = submodule if submodule in modules else _known(base, modules)
        if target:
            found.add(target)
    return found


def _imports_of(module: Module, modules: dict[str, Module]) -> Iterator[Import]:
    text = module.path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(module.path))
    lazy = _lazy_lines(text)
    lines = text.splitlines()

    def commented(first: int, last: int) -> bool:
        above = first - 1
        return bool(set(range(first, last + 1)) & lazy) or (
            above in lazy and lines[above - 1].lstrip().startswith("#"))

    for node, where in _statements(tree.body, MODULE_LEVEL):
        snippet = lines[node.lineno - 1].strip()
        marked = commented(node.lineno, node.end_lineno or node.lineno)
        for target in sorted(_targets(node, module, modules)):
            yield Import(module, target, node.lineno, where, marked, snippet)
    # a module that imports by name reaches every psrv module it names in a string: an edge the
    # import statements do not show (marked lazy where every such call says why)
    calls = _imports_by_name(tree)
    if calls:
        marked = all(commented(line, line) for line in calls)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules \
                    and node.value.startswith("psrv."):
                text = lines[node.lineno - 1].strip() + f"  (imported by name at line {calls[0]})"
                yield Import(module, node.value, node.lineno, DYNAMIC, marked, text)


def strongly_connected(nodes: Iterable[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member (each one a cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return sorted(found)
