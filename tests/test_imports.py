"""The package's import graph (read with ast, nothing imported): no circles, no arrow from a lower layer to a higher
one, and imports at the top of each module except heavy optional dependencies (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tl_query_lens"

# docs/architecture.md's layers, lowest first: a module may import only its own layer and the ones before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "errors",
            "config",
            "presentation",
            "protocols",
            "results",
            "hooks",
            "primitives",
            "broad_corpus",
            "corpus",
            "documents",
            "models",
            "releases",
            "paths",
            "interrupts",
            "broad_corpus",
        ),
    ),
    ("engine", ("operators",)),
    ("dictionaries", ("dictionaries",)),
    ("methods", ("query_lens", "readout", "certify", "saes")),
    # "": the package's own __init__
    ("surfaces", ("sources", "tracking", "report", "atlas", "demo", "reproduce", "cli", "__main__", "")),
]
# Imported where they are used (inside a function): slow to import and not needed by most calls.
HEAVY_OPTIONAL = {"wandb", "plotly", "selenium", "scipy", "sae_bench", "transformers", "datasets", "huggingface_hub"}
# cli/ is being rebuilt from the configs in its own change (issue 25, item 1), which removes its circle
# (cli/dictionaries.py <-> cli/validate.py) and its imports of the package's __init__; it keeps lazy imports so that
# `tlql --help` starts at once. Drop it from this tuple when that change is in.
NOT_CHECKED = ("tl_query_lens.cli",)
# In-function imports left where they are, each with the reason (files being rewritten in other changes).
ALLOWED_INNER = {
    ("tl_query_lens.saes.train", "tl_query_lens.corpus"): "saes/train.py is being rewritten (one SAE trainer)",
    ("tl_query_lens.releases", "tl_query_lens.models"): "releases.py is being rewritten in the same round",
    ("tl_query_lens.errors", "torch"): "config.py imports errors.py, and the CLI builds configs before torch loads",
    ("tl_query_lens.dictionaries.saved", "torch"): "the CLI checks --device before torch loads",
    ("tl_query_lens.paths", "fcntl"): "POSIX only: the folder lock degrades where fcntl does not exist",
}
# Upward arrows left, with the reason.
ALLOWED_UPWARD = {
    ("tl_query_lens.saes.report", "tl_query_lens.tracking"): "report_cli(args) leaves the library with the CLI rebuild",
}


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


def internal_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        if module.startswith(NOT_CHECKED):
            continue
        targets = {name for name, _, _ in imports(module) if name in MODULES and name != module}
        targets = {t for t in targets if not t.startswith(NOT_CHECKED)}
        graph[module] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None (iterative DFS, three colours)."""
    colour = dict.fromkeys(graph, 0)
    for start in sorted(graph):
        if colour[start]:
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        colour[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                colour[node] = 2
                stack.pop()
                continue
            nxt = todo.pop()
            if colour[nxt] == 1:
                path = [n for n, _ in stack]
                return [*path[path.index(nxt) :], nxt]
            if colour[nxt] == 0:
                colour[nxt] = 1
                stack.append((nxt, sorted(graph[nxt])))
    return None


def test_find_cycle_finds_one():
    """The checker can fail: a made-up circle a → b → c → a is found, a tree is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) in (["a", "b", "c", "a"],)
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circles():
    cycle = find_cycle(internal_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_upward_imports():
    upward = []
    for module, targets in internal_graph().items():
        for target in targets:
            if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED_UPWARD:
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_the_package_init_is_imported_by_no_module():
    offenders = [m for m, targets in internal_graph().items() if "tl_query_lens" in targets]
    assert not offenders, f"{offenders} import the package's __init__; import the module that defines the name"


@pytest.mark.parametrize("module", [m for m in MODULES if not m.startswith(NOT_CHECKED)])
def test_imports_are_at_the_top(module):
    inner = [
        f"line {line}: {name}"
        for name, top, line in imports(module)
        if not top and name.split(".")[0] not in HEAVY_OPTIONAL and (module, name) not in ALLOWED_INNER
    ]
    assert not inner, f"{module} imports inside functions (move them to the top of the module): {inner}"
