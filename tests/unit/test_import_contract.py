"""psrv's import contract, checked on the source tree this test sits in.

The layers point one way (encoding < transport < server < torch < spark, nn < torch; the top ``psrv`` holds
the version and ``run``, whose function-level import of ``psrv.torch`` is its only way up), inside
``psrv.spark`` the task side never reaches the driver side, there are no import cycles between modules or
between packages, each package's ``errors.py`` sits at its bottom, a function-level import of psrv says
why (``# lazy: ...``), every public module declares ``__all__``, and pyproject's package-dir mapping
covers every folder. Each failure lists every violation as
``file:line: what ... fix: ...``.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from collections import deque
from collections.abc import Callable

import pytest
from import_graph import (
    DYNAMIC,
    FUNCTION_LEVEL,
    ROOT,
    TYPE_CHECKING_ONLY,
    Import,
    Source,
    read_mapping,
    read_source,
    strongly_connected,
)

SOURCE: Source = read_source()

#: each layer and the layers it may import; the top-level ``psrv``'s modules import nothing and anything may
#: import them (the subpackages read ``psrv._version``, never ``psrv``'s ``__init__``)
ALLOWED: dict[str, set[str]] = {
    "top": {"top"},
    "encoding": {"top", "encoding"},
    "transport": {"top", "encoding", "transport"},
    "server": {"top", "encoding", "transport", "server"},
    "nn": {"top", "nn"},
    "torch": {"top", "encoding", "transport", "server", "nn", "torch"},
    "spark": {"top", "encoding", "transport", "server", "nn", "torch", "spark"},
}

#: the front door: the layers the ``psrv`` package's ``__init__`` may reach, by function-level (or type-only)
#: imports alone, so that ``import psrv`` stays light: ``psrv.run`` calls ``psrv.torch``'s launcher
FRONT_DOOR: dict[str, set[str]] = {"psrv": {"transport", "torch"}}

#: inside psrv.spark: the packages (and their subpackages) a package's modules must not reach, even
#: through other modules
SPARK_SIDES: dict[str, tuple[str, ...]] = {
    "psrv.spark.task": ("psrv.spark.driver",),
    "psrv.spark.data": ("psrv.spark.driver", "psrv.spark.task"),
    "psrv.spark.observe": ("psrv.spark.driver", "psrv.spark.task"),
}


def _layer(name: str) -> str:
    """The layer of a module: its first package under psrv; the top-level package's own modules are "top"."""
    parts = name.split(".")
    module = SOURCE.modules.get(name)
    on_top = len(parts) == 1 or (module is not None and module.package == "psrv")
    return "top" if on_top else parts[1]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _in_file_order(text: str) -> list[str | int]:
    """Sort key: file, then line as a number (``a.py:9`` before ``a.py:10``)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _report(rule: str, violations: list[str]) -> str:
    listed = sorted(set(violations), key=_in_file_order)
    return f"{len(listed)} violation(s) of {rule}:\n" + "\n".join(listed)


def _graph(*, type_checking: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in SOURCE.modules}
    for imp in SOURCE.edges(type_checking=type_checking):
        graph[imp.source.name].add(imp.target)
    return graph


def _path(graph: dict[str, set[str]], start: str, goal: Callable[[str], bool]) -> list[str] | None:
    """The shortest import chain from ``start`` to a module that ``goal`` accepts."""
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if goal(node):
            chain = [node]
            while (parent := previous[chain[-1]]) is not None:
                chain.append(parent)
            return chain[::-1]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


def test_layers_point_one_way() -> None:
    violations = []
    for imp in SOURCE.edges():
        layer, target_layer = _layer(imp.source.name), _layer(imp.target)
        lazy = imp.where in (FUNCTION_LEVEL, TYPE_CHECKING_ONLY)
        if lazy and target_layer in FRONT_DOOR.get(imp.source.name, set()):
            continue
        if target_layer not in ALLOWED.get(layer, set()):
            below = ", ".join(sorted(ALLOWED.get(layer, set()) - {"top"})) or "nothing"
            violations.append(
                f"{imp.at}: {imp.source.name} ({layer}) imports {imp.target} ({target_layer}): `{imp.text}`; "
                f"fix: {layer} may import only {below}: move what it uses down, or have {target_layer} "
                f"pass it in"
            )
    assert not violations, _report("the layers (encoding < transport < server < torch < spark, nn < torch)",
                                   violations)


def test_spark_task_data_observe_never_reach_the_driver() -> None:
    graph = _graph(type_checking=True)
    violations = []
    for imp in SOURCE.edges():
        for side, forbidden in SPARK_SIDES.items():
            if not _within(imp.source.name, side) or _within(imp.target, side):
                continue
            chain = _path(graph, imp.target, lambda name, bad=forbidden: any(_within(name, f) for f in bad))
            if chain is None:
                continue
            how = "" if len(chain) == 1 else " through " + " -> ".join(chain)
            violations.append(
                f"{imp.at}: {imp.source.name} reaches {chain[-1]}{how}: `{imp.text}`; "
                f"fix: {side} must not depend on {' or '.join(forbidden)}: move what it needs into "
                f"{side} (or a package both use), or have the driver pass it in"
            )
    assert not violations, _report("the spark sides (task, data, observe never import driver)", violations)


def _cycle_report(members: list[str], node_of: Callable[[Import], tuple[str, str]], kind: str) -> str:
    inside = set(members)
    by_pair: dict[tuple[str, str], list[Import]] = {}
    for imp in SOURCE.edges(type_checking=False):
        source, target = node_of(imp)
        if source != target and source in inside and target in inside:
            by_pair.setdefault((source, target), []).append(imp)
    lines = []
    for (source, target), imps in sorted(by_pair.items()):
        imps.sort(key=lambda imp: (imp.source.rel, imp.line))
        more = f" (+{len(imps) - 3} more)" if len(imps) > 3 else ""
        lines.append(f"    {source} -> {target}: " + "; ".join(f"{i.at} `{i.text}`" for i in imps[:3]) + more)
    return (
        f"{kind} cycle {' <-> '.join(members)}; fix: move what both sides need into a module below them "
        f"(or pass it in), so that the imports point one way:\n" + "\n".join(lines)
    )


def test_no_cycles_between_modules() -> None:
    """Module-level and function-level imports count; a type-only one (``if TYPE_CHECKING:``) never runs."""
    cycles = strongly_connected(SOURCE.modules, _graph(type_checking=False))
    violations = [_cycle_report(c, lambda imp: (imp.source.name, imp.target), "module") for c in cycles]
    assert not violations, _report("no import cycles between modules", violations)


def _package_node(name: str) -> str:
    module = SOURCE.modules[name]
    return f"{name}.__init__" if module.is_package else module.package


def test_no_cycles_between_packages() -> None:
    """A package's modules are one node, a subpackage is a node of its own, and a package's ``__init__``
    is a node apart: it is the package's front door, which re-exports what its modules and subpackages
    define (``psrv.spark`` exports ``SparkNetwork`` from ``psrv.spark.driver``), while the subpackages
    stand on the package's own modules (``psrv.spark.errors``, ``psrv.spark.storage``). A module that
    imports a package's ``__init__`` depends on everything it re-exports, so a cycle through it counts."""
    packages = {_package_node(name) for name in SOURCE.modules}
    graph: dict[str, set[str]] = {package: set() for package in packages}

    def node_of(imp: Import) -> tuple[str, str]:
        return _package_node(imp.source.name), _package_node(imp.target)

    for imp in SOURCE.edges(type_checking=False):
        source, target = node_of(imp)
        if source != target:
            graph[source].add(target)
    cycles = strongly_connected(packages, graph)
    violations = [_cycle_report(c, node_of, "package") for c in cycles]
    assert not violations, _report("no import cycles between packages", violations)


def test_errors_modules_sit_at_the_bottom() -> None:
    violations = []
    for imp in SOURCE.edges():
        module = imp.source
        if module.is_package or not module.name.endswith(".errors"):
            continue
        target = SOURCE.modules[imp.target]
        allowed = (
            target.name.endswith(".errors")
            and not target.is_package
            and not _within(target.package, module.package)
            and _layer(target.name) in ALLOWED[_layer(module.name)]
        )
        if not allowed:
            violations.append(
                f"{imp.at}: {module.name} imports {imp.target}: `{imp.text}`; fix: an errors module imports "
                f"only the errors modules of lower layers or parent packages: move the dependency out"
            )
    assert not violations, _report("errors.py at the bottom of each package", violations)


def test_function_level_imports_say_why() -> None:
    violations = []
    for imp in SOURCE.imports:
        if imp.lazy_comment:
            continue
        if imp.where == FUNCTION_LEVEL:
            violations.append(
                f"{imp.at}: function-level import of {imp.target}: `{imp.text}`; fix: move it to module "
                f"level, or, where it keeps `import psrv` / the CLI light or avoids a cycle that cannot go, "
                f"end the line with `# lazy: <why>`"
            )
        elif imp.where == DYNAMIC:
            violations.append(
                f"{imp.at}: {imp.target} is imported by name: `{imp.text}`; fix: import it with an import "
                f"statement (which the layers can check), or end the import_module line with `# lazy: <why>`"
            )
    assert not violations, _report("function-level psrv imports only with `# lazy:`", violations)


def _public(name: str) -> bool:
    stem = SOURCE.modules[name].path.stem
    return stem == "__init__" or not stem.startswith("_")


PUBLIC = sorted(name for name in SOURCE.modules if _public(name))


def _declares_all(name: str) -> bool:
    tree = ast.parse(SOURCE.modules[name].path.read_text(encoding="utf-8"))
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign)
            else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return False


def test_every_public_module_declares_all() -> None:
    violations = [
        f"{SOURCE.modules[name].rel}:1: {name} has no __all__; fix: list its public names in `__all__` "
        f"(or rename the module with a leading `_` if nothing in it is public)"
        for name in PUBLIC
        if not _declares_all(name)
    ]
    assert not violations, _report("`__all__` in every public module", violations)


@pytest.mark.parametrize("name", [n for n in PUBLIC if _declares_all(n)])
def test_every_name_in_all_exists(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] != "psrv":
            pytest.skip(f"{name} needs {exc.name}, which is not installed (an optional dependency)")
        raise
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    rel = SOURCE.modules[name].rel
    violations = [f"{rel}: {name}.__all__ names {n!r}, which it does not define; fix: define it or drop it "
                  f"from __all__" for n in missing]
    assert not violations, _report("names in `__all__` exist", violations)


_RESOLVE = """
import importlib, importlib.util, json, sys
from importlib import metadata
packages, strays = json.loads(sys.argv[1])
files = {name: importlib.import_module(name).__file__ for name in packages}
found = {}
for name in strays:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    found[name] = spec.origin or str(list(spec.submodule_search_locations or [])) if spec else None
dist = metadata.distribution("psrv")
names = (dist.read_text("top_level.txt") or "").split()
for file in dist.files or ():
    if file.name.startswith("__editable__") and file.name.endswith("_finder.py"):
        names += list(importlib.import_module(file.stem).MAPPING)
print(json.dumps([files, found, names]))
"""


def test_mapping_covers_every_folder_and_installs_only_psrv(tmp_path) -> None:
    mapping = read_mapping()
    violations = []
    listed, mapped = set(mapping.packages), set(mapping.dirs)
    for name in sorted(listed - mapped):
        violations.append(f"pyproject.toml: {name} is in packages but has no package-dir entry; fix: map it")
    for name in sorted(mapped - listed):
        violations.append(f"pyproject.toml: {name} has a package-dir entry but is not in packages; "
                          f"fix: list it")
    for name, folder in sorted(mapping.dirs.items()):
        if not (folder / "__init__.py").is_file():
            violations.append(f"pyproject.toml: {name} maps to {folder.relative_to(ROOT)}, which is not a "
                              f"package folder; fix: point it at the folder or create its __init__.py")
    folders = set(mapping.dirs.values())
    for folder in sorted(folders):
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" not in path.parts and path.parent not in folders:
                violations.append(f"{path.relative_to(ROOT)}:1: its folder is under a mapped package but not "
                                  f"mapped itself, so it is not installed; fix: add it to packages and "
                                  f"package-dir in pyproject.toml")
    # the installed psrv, seen from outside the source tree (no cwd on sys.path): each package from its
    # folder, and no folder of the repository importable under a name of its own
    strays = sorted({p.relative_to(ROOT).parts[0] for p in folders if p != ROOT} | {"tests", "scripts"}
                    | {p.parent.name for p in ROOT.glob("*/__init__.py")})
    out = subprocess.run([sys.executable, "-I", "-c", _RESOLVE, json.dumps([sorted(mapped), strays])],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    files, found, installed = json.loads(out.stdout)
    for name in sorted(set(installed)):
        if name.split(".")[0] != "psrv":
            violations.append(f"psrv installs the import name {name!r}; fix: map its folder "
                              f"under psrv in pyproject.toml (packages and package-dir) and reinstall")
    for name, file in sorted(files.items()):
        expected = mapping.dirs[name] / "__init__.py"
        if file is None or not expected.samefile(file):
            violations.append(f"installed {name} resolves to {file}, not {expected.relative_to(ROOT)}; fix: "
                              f"reinstall (`pip install -e . --no-deps`) after changing the mapping")
    for name, origin in sorted(found.items()):
        if origin and str(ROOT) in origin:
            violations.append(f"`import {name}` works outside the tree ({origin}); fix: install only psrv "
                              f"(map the folder under psrv in pyproject.toml)")
    assert not violations, _report("the package-dir mapping", violations)


def test_the_reader_sees_every_kind_of_import(tmp_path) -> None:
    """The graph itself, on a small mapped tree: each kind of import resolves to the module it reaches."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackages = ["psrv", "psrv.a", "psrv.a.sub"]\n'
        '[tool.setuptools.package-dir]\n"psrv" = "top"\n"psrv.a" = "a"\n"psrv.a.sub" = "a/sub"\n'
    )
    files = {
        "top/__init__.py": "",
        "a/__init__.py": "from psrv.a.one import ONE\n",
        "a/one.py": "ONE = 1\n",
        "a/two.py": (
            "from typing import TYPE_CHECKING\n"
            "from . import one\n"
            "from psrv.a import ONE\n"
            "if TYPE_CHECKING:\n"
            "    from .sub.deep import Deep\n"
            "def f():\n"
            "    # lazy: the reason, on the line above\n"
            "    import psrv.a.sub.deep\n"
            "    from psrv.a.sub import deep  # lazy: the reason, on the line\n"
            "    from psrv.a.one import ONE\n"
        ),
        "a/sub/__init__.py": "import importlib\nNAMES = ['psrv.a.one']\nimportlib.import_module(NAMES[0])\n",
        "a/sub/deep.py": "from ..one import ONE\nclass Deep:\n    pass\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    source = read_source(tmp_path)
    assert sorted(source.modules) == ["psrv", "psrv.a", "psrv.a.one", "psrv.a.sub", "psrv.a.sub.deep",
                                      "psrv.a.two"]
    found = {(imp.source.name, imp.line, imp.target, imp.where, imp.lazy_comment) for imp in source.imports}
    assert found == {
        ("psrv.a", 1, "psrv.a.one", "module", False),
        ("psrv.a.two", 2, "psrv.a.one", "module", False),
        ("psrv.a.two", 3, "psrv.a", "module", False),
        ("psrv.a.two", 5, "psrv.a.sub.deep", TYPE_CHECKING_ONLY, False),
        ("psrv.a.two", 8, "psrv.a.sub.deep", FUNCTION_LEVEL, True),
        ("psrv.a.two", 9, "psrv.a.sub.deep", FUNCTION_LEVEL, True),
        ("psrv.a.two", 10, "psrv.a.one", FUNCTION_LEVEL, False),
        ("psrv.a.sub", 2, "psrv.a.one", DYNAMIC, False),
        ("psrv.a.sub.deep", 1, "psrv.a.one", "module", False),
    }
    assert strongly_connected(["a", "b", "c"], {"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
