"""No import cycle inside ffload, and every module imports on its own in a fresh interpreter.

Two checks, because Python hides cycles: a module-level cycle can import fine in one order and
fail in another, and a cycle through a function-level import (or a module ``__getattr__``) imports
fine until that function runs. So (1) every ``import`` statement of every module, at any depth,
makes an edge of the module graph, which must have no cycle; (2) a fresh interpreter imports
every module with no other ffload module loaded before it, which must succeed.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import ffload

PACKAGE_DIR = os.path.dirname(ffload.__file__)
REPO = os.path.dirname(PACKAGE_DIR)


def ffload_modules() -> dict[str, str]:
    """Module name -> file of every module of the ffload package (packages as their ``__init__``)."""
    modules = {}
    for dirpath, dirnames, filenames in os.walk(PACKAGE_DIR):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for filename in filenames:
            if filename.endswith(".py"):
                path = os.path.join(dirpath, filename)
                name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                modules[name.removesuffix(".__init__")] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """The ffload modules that ``name`` imports anywhere in its code (outside ``if TYPE_CHECKING``):
    ``from pkg import mod`` counts as importing ``pkg.mod``, ``from pkg import obj`` as ``pkg``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    skipped = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node) for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imported_modules_resolves_relative_imports():
    modules = ffload_modules()
    deps = imported_modules("ffload.convert.sources.cifar", modules["ffload.convert.sources.cifar"], modules)
    assert "ffload.convert.sources.base" in deps
    deps = imported_modules("ffload.convert.sources", modules["ffload.convert.sources"], modules)
    assert {"ffload.convert.sources.detect", "ffload.convert.sources.cifar"} <= deps


def import_graph() -> dict[str, set[str]]:
    """Module -> the ffload modules it imports (see :func:`imported_modules`)."""
    modules = ffload_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def graph_in_a_fresh_interpreter() -> dict[str, set[str]]:
    """:func:`import_graph`, parsed in a fresh interpreter: CPython 3.11.7's AST constructor is not thread-safe,
    and threads that earlier tests leave behind (ffcv's, numba's) make ast.parse fail at random here."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from test_imports import import_graph; "
        "print(json.dumps({k: sorted(v) for k, v in import_graph().items()}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(__file__)], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    graph = {k: set(v) for k, v in json.loads(proc.stdout).items()}
    assert len(graph) > 40 and graph["ffload.convert.sources"]
    return graph


def test_no_import_cycle():
    graph = graph_in_a_fresh_interpreter()
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


LAYERS = {  # room -> the rooms none of its modules may reach, directly or through others
    "ffload._jit": (
        "ffload.codecs",
        "ffload.formats",
        "ffload.convert",
        "ffload.loaders",
        "ffload.recipes",
        "ffload.bench",
    ),
    "ffload.codecs": ("ffload.formats", "ffload.convert", "ffload.loaders", "ffload.recipes", "ffload.bench"),
    "ffload.formats": ("ffload.convert", "ffload.loaders", "ffload.recipes", "ffload.bench"),
    "ffload.convert": ("ffload.loaders", "ffload.recipes", "ffload.bench", "ffload.cli"),
    "ffload.loaders": ("ffload.convert", "ffload.recipes", "ffload.bench", "ffload.cli"),
}
"""The rooms' order (formats <- convert, formats <- loaders <- recipes, codecs shared by both): conversion never
loads the loaders (nor numba's compiled pipelines), the loaders never the converters."""


def test_rooms_import_only_the_rooms_below_them():
    graph = graph_in_a_fresh_interpreter()

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    for room, forbidden in LAYERS.items():
        for module in (m for m in graph if m == room or m.startswith(room + ".")):
            bad = sorted(m for m in reach(module) if m.startswith(tuple(f + "." for f in forbidden) + forbidden))
            assert not bad, f"{module} reaches {bad[:5]}"


# argv: PACKAGE MODULE...; imports each MODULE with no module of PACKAGE loaded before it, prints
# "<module>: <error>" per failure and exits with 1 if any.
_IMPORT_EACH_ALONE = """
import importlib, sys
package, failed = sys.argv[1], []
for name in sys.argv[2:]:
    for loaded in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """A fresh interpreter imports each module with no other ffload module loaded before it (ffload's
    modules are dropped from ``sys.modules`` in between; torch, numba... stay loaded, to keep this
    cheap: an import-order bug of ffload needs only ffload's modules to be fresh)."""
    names = sorted(ffload_modules())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_ALONE, "ffload", *names],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert len(names) > 40
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_import_check_reports_a_failing_module(tmp_path):
    """The check above fails on a module that cannot be imported alone."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\nA = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("from pkg.a import A\nB = 2\n")  # a cycle: fails whichever comes first
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_ALONE, "pkg", "pkg.a", "pkg.b"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 1
    assert "pkg.a: ImportError" in proc.stdout and "pkg.b: ImportError" in proc.stdout


@pytest.mark.parametrize(
    "module", ["ffload.convert.sources", "ffload.convert.sources.cifar", "ffload.convert.sources.detect"]
)
def test_sources_have_no_module_getattr(module):
    """The lazy re-export that hid the sources <-> cifar cycle is gone."""
    import importlib

    assert not hasattr(importlib.import_module(module), "__getattr__")
