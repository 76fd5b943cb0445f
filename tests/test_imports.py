"""The package's import graph (read with ast, nothing imported): no circles, no arrow from a lower layer to a higher
one, and imports at the top of each module except heavy optional dependencies (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tl_query_lens"

# docs/architecture.md's layers, lowest first: a module may import only its own layer and the ones before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "errors",
            "lazy",
            "config",
            "command",
            "limits",
            "presentation",
            "protocols",
            "results",
            "hooks",
            "primitives",
            "broad_corpus",
            "corpus",
            "documents",
            "models",
            "precision",
            "releases",
            "paths",
            "interrupts",
            "ranges",
            "budget",
            "wandb_env",
            "tensor_checks",
            "estimates",
        ),
    ),
    ("engine", ("operators",)),
    ("dictionaries", ("dictionaries",)),
    # sources: the one dictionary loader of every family (FF-KV, readout SAEs, the SAE suites), used by the methods'
    # commands (tl_query_lens/query_lens/commands.py)
    ("methods", ("query_lens", "readout", "certify", "saes", "sources")),
    # "": the package's own __init__
    (
        "surfaces",
        (
            "checks",
            "commands",
            "saes_commands",
            "tracking",
            "report",
            "atlas",
            "demo",
            "demo_config",
            "demo_progress",
            "reproduce",
            "cli",
            "__main__",
            "",
        ),
    ),
]
# Imported where they are used (inside a function): slow to import and not needed by most calls.
HEAVY_OPTIONAL = {"wandb", "plotly", "selenium", "scipy", "sae_bench", "transformers", "datasets", "huggingface_hub"}
CLI = "tl_query_lens.cli"
# The one module below cli/ that may import it: `python -m tl_query_lens` runs the command line.
ENTRY_POINTS = {"tl_query_lens.__main__"}
# Left out of test_imports_are_at_the_top only (the circle, package-face, layer and cli/ checks read it like every
# other package): cli/ imports the methods' configs inside the functions that configure a subcommand, because those
# configs import torch and `tlql --help` must answer without it. Drop this when the configs no longer import torch
# (docs/architecture.md, "Layers").
LAZY_IMPORTS = (CLI,)


def module_name(path: Path) -> str:
    parts = ["tl_query_lens", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def layer_of(module: str) -> int:
    first = module.split(".")[1] if "." in module else ""
    for index, (_, names) in enumerate(LAYERS):
        if first in names:
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and to docs/architecture.md")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(module: str) -> list[tuple[str, bool, int]]:
    """``(imported module, at top level, line)`` for every executed import of ``module`` (TYPE_CHECKING skipped)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, top, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against the importing package
                    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
                    base = ".".join(package[: len(package) - child.level + 1] + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    found.append((sub if sub in MODULES else base, top, child.lineno))
            else:
                nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, top and not nested)

    visit(tree, True)
    return found


@cache
def internal_graph() -> dict[str, frozenset[str]]:
    """Module → the package's modules it imports (top level and inside functions; TYPE_CHECKING blocks aside)."""
    return {
        module: frozenset(name for name, _, _ in imports(module) if name in MODULES and name != module)
        for module in MODULES
    }


def import_circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module, and modules that
    import themselves (Tarjan's algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    circles.append(sorted(component))
    return sorted(circles)


def test_import_circles_finds_them():
    """The checker can fail: made-up circles are found (one of three, one of two, a self-import), a tree is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}, "g": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert import_circles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_imports_are_read_inside_functions_and_not_under_type_checking(tmp_path, monkeypatch):
    """The reader sees an import inside a function and a relative one, and skips a TYPE_CHECKING block."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "b.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
        "def f():\n    from . import b\n    import pkg\n"
    )
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py"}
    monkeypatch.setattr(sys.modules[__name__], "MODULES", modules)
    assert imports("pkg.a") == [("typing", True, 1), ("pkg.b", False, 5), ("pkg", False, 6)]


def test_no_import_circles():
    circles = import_circles(internal_graph())
    assert not circles, "import circles (each a set of modules that import one another):\n" + "\n".join(
        " <-> ".join(circle) for circle in circles
    )


def test_no_module_imports_its_own_package():
    """A module imports the module that defines a name, never the face (``__init__``) of a package it is part of."""
    offenders = [
        f"{module} imports {target}"
        for module, targets in internal_graph().items()
        for target in sorted(targets)
        if module.startswith(target + ".")
    ]
    assert not offenders, "import the module that defines the name instead:\n" + "\n".join(sorted(offenders))


def test_nothing_below_the_cli_imports_it():
    """The library never calls up into the command line; only the ``python -m`` entry point starts it."""
    offenders = [
        f"{module} imports {target}"
        for module, targets in internal_graph().items()
        for target in sorted(targets)
        if (target == CLI or target.startswith(CLI + ".")) and not module.startswith(CLI) and module not in ENTRY_POINTS
    ]
    assert not offenders, "move what is needed out of cli/ (into a foundation module):\n" + "\n".join(offenders)


def test_no_upward_imports():
    upward = []
    for module, targets in internal_graph().items():
        for target in targets:
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


@pytest.mark.parametrize("module", [m for m in MODULES if not m.startswith(LAZY_IMPORTS)])
def test_imports_are_at_the_top(module):
    inner = [
        f"line {line}: {name}"
        for name, top, line in imports(module)
        if not top and name.split(".")[0] not in HEAVY_OPTIONAL
    ]
    assert not inner, f"{module} imports inside functions (move them to the top of the module): {inner}"
