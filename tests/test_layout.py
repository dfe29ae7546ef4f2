"""The package's layout shows the pipeline (docs/design.md): every module
belongs to one stage, a stage imports only the stages below it, and no module
imports itself back through others (no cycle, lazy imports in functions
included). Read from the sources with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "synth"

# the shared top level: what every stage may use
SHARED = {"version", "errors", "units", "resources", "documents", "topology", "linkgraph", "interrupts", "collector",
          "blas", "caches"}
# top-level modules that are not shared values: the plan document (built from the
# synthesis stage), the public API and the framework adapters
TOP_LEVEL = SHARED | {"plan", "api", "torch", "jax"}
STAGES = ("synthesis", "cost", "planner", "runtime", "export", "testbed", "cli")

# stage -> the stages its modules may import (itself included)
ALLOWED = {
    "shared": {"shared"},
    "synthesis": {"shared", "synthesis"},
    "plan": {"shared", "synthesis"},
    "cost": {"shared", "synthesis", "cost"},
    "planner": {"shared", "synthesis", "plan", "cost", "planner"},
    "runtime": {"shared", "synthesis", "plan", "cost", "runtime"},
    "export": {"shared", "synthesis", "plan", "cost", "planner", "runtime", "export"},
    "testbed": {"shared", "synthesis", "cost", "testbed"},
    "adapter": {"shared", "synthesis", "plan", "cost", "runtime", "export"},
    "api": {"shared", "synthesis", "plan", "cost", "planner", "api"},
    "cli": {"shared", "synthesis", "plan", "cost", "planner", "runtime", "export", "testbed", "api", "cli"},
}


def module_name(path: Path) -> str:
    parts = ["synth", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage(module: str) -> str:
    """The stage of a module of the package (``synth`` itself: the facade)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "facade"
    if parts[1] in STAGES:
        return parts[1]
    if parts[1] in SHARED:
        return "shared"
    if parts[1] in ("torch", "jax"):
        return "adapter"
    return parts[1]  # plan, api


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports(module: str, typing: bool = False) -> set[str]:
    """The package modules ``module`` imports when it runs (at its top or in a
    function; under ``if TYPE_CHECKING:`` only with ``typing``), each resolved
    to a module: ``from . import x`` is the submodule ``x`` where there is one."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child) and not typing:
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "synth")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] != "synth":
                    continue
                subs = [f"{target}.{a.name}" for a in child.names if f"{target}.{a.name}" in MODULES]
                found.update(subs or [target])
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in MODULES} - {module}


GRAPH = {m: imports(m) for m in MODULES}
# with the imports for type checkers only: a stage does not name a higher one's types either
TYPED_GRAPH = {m: imports(m, typing=True) for m in MODULES}


def test_every_module_is_found_and_resolved():
    """The walk sees the modules it judges (a broken resolution would pass every
    other test vacuously)."""
    assert "synth.synthesis.search" in MODULES and "synth.runtime.executor" in MODULES
    assert "synth.synthesis.semantics" in GRAPH["synth.synthesis.search"]
    assert "synth.runtime.executor" in GRAPH["synth.torch"]  # `from .runtime import executor as runtime`
    assert "synth.errors" in GRAPH["synth.cli"]
    # lazy imports count: the backends import the torch world when it is chosen
    assert "synth.runtime.torch_world" in GRAPH["synth.runtime.backends"]


def test_top_level_holds_only_shared_values():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert set(top) <= TOP_LEVEL, f"modules outside a stage: {sorted(set(top) - TOP_LEVEL)}"
    assert len(top) + 1 <= 16
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert packages == sorted(STAGES + ("api",))  # the stages, and the public API's package


@pytest.mark.parametrize("package", STAGES)
def test_each_stage_says_what_it_does_and_imports(package):
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    assert doc and ("Imports:" in doc or "imports" in doc), f"synth/{package}/__init__.py: no docstring on imports"


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a stage that its stage may not import."""
    wrong = []
    for module, targets in sorted(graph.items()):
        source = stage(module)
        if source == "facade":
            continue  # synth/__init__ loads the public names lazily (importlib)
        for target in sorted(targets):
            if stage(target) not in ALLOWED[source] | {"facade"}:
                wrong.append(f"{module} ({source}) imports {target} ({stage(target)})")
    return wrong


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """The cycles a depth-first search meets (one per back edge)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []
    found: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                found.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                walk(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return found


def test_a_stage_imports_only_the_stages_below_it():
    """Imports for type checkers count: a lower stage naming a higher one's
    type, even for an annotation only, is an arrow up as well."""
    wrong = violations(TYPED_GRAPH)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    found = cycles(GRAPH)
    assert not found, "\n".join(found)


def test_the_checks_catch_a_violation():
    """Both checks on graphs with an upward import and a cycle: the backends
    taking the torch world from the adapter, the adapter taking dtypes back
    (the cycle this layout removed)."""
    upward = {"synth.synthesis.verify": {"synth.cost.predict"}, "synth.cost.predict": set()}
    assert violations(upward) == ["synth.synthesis.verify (synthesis) imports synth.cost.predict (cost)"]
    cycle = {"synth.runtime.backends": {"synth.torch"}, "synth.torch": {"synth.runtime.backends"}}
    assert cycles(cycle) == ["synth.runtime.backends -> synth.torch -> synth.runtime.backends"]
    assert violations(cycle) == ["synth.runtime.backends (runtime) imports synth.torch (adapter)"]


#: the most lines a module of the package may have
MODULE_LINES_LIMIT = 800


def too_long(modules: dict[str, Path], limit: int = MODULE_LINES_LIMIT) -> list[str]:
    """The modules of more than ``limit`` lines, with their line counts."""
    counts = {name: len(path.read_text().splitlines()) for name, path in sorted(modules.items())}
    return [f"{name}: {n} lines" for name, n in counts.items() if n > limit]


def test_no_module_is_over_the_line_limit():
    """No module of synth/ over 800 lines: a part that grows past it is split
    by concern (as the state space is, synth/synthesis/statespace/)."""
    found = too_long(MODULES)
    assert not found, "\n".join(found)


def test_the_line_limit_catches_a_long_module(tmp_path):
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    long.write_text("x = 1\n" * (MODULE_LINES_LIMIT + 1))
    short.write_text("x = 1\n" * MODULE_LINES_LIMIT)
    assert too_long({"long": long, "short": short}) == [f"long: {MODULE_LINES_LIMIT + 1} lines"]


def unregistered_memos(modules: dict[str, Path]) -> list[str]:
    """Every use of ``functools.lru_cache`` or ``functools.cache`` outside
    synth/caches.py: memos go through ``synth.caches.memoised`` so that
    ``clear_caches`` finds them in its registry."""
    found = []
    for name, path in sorted(modules.items()):
        if name == "synth.caches":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "functools":
                found += [f"{name}: imports functools.{a.name}" for a in node.names if a.name in ("lru_cache", "cache")]
            elif isinstance(node, ast.Attribute) and node.attr in ("lru_cache", "cache") and \
                    isinstance(node.value, ast.Name) and node.value.id == "functools":
                found.append(f"{name}: uses functools.{node.attr}")
    return found


def test_every_memo_is_registered():
    found = unregistered_memos(MODULES)
    assert not found, "\n".join(found)


def test_the_memo_check_catches_a_bare_lru_cache(tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text("from functools import lru_cache\nimport functools\n\n@functools.cache\ndef f(): pass\n")
    assert unregistered_memos({"bare": bare}) == ["bare: imports functools.lru_cache", "bare: uses functools.cache"]


def test_every_package_is_installed():
    """pyproject's ``packages`` names every package of synth/ (a package left
    out is missing from a non-editable install, silently)."""
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    found = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"


def test_the_tests_mirror_the_packages():
    """tests/ holds a folder per stage it tests (tests/synthesis/, tests/cost/
    ...) and, beside conftest.py, the tests of the top-level modules; no other
    folder, and no test module in a folder of another name."""
    tests = Path(__file__).resolve().parent
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    assert folders and set(folders) <= set(STAGES), f"test folders that are no stage: {set(folders) - set(STAGES)}"
    assert all(p.parent == tests or p.parent.name in STAGES for p in tests.rglob("test_*.py"))
