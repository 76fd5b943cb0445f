"""Packages load their public names on first use (``tl_query_lens.lazy``): on a made-up package, then on every
package of tl_query_lens that uses it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tl_query_lens"


def lazy_packages() -> list[str]:
    """The packages whose ``__init__.py`` hands a map of public names to ``lazy_package``."""
    inits = [PACKAGE / "__init__.py", *sorted(PACKAGE.glob("*/__init__.py"))]
    return [
        "tl_query_lens" if init.parent == PACKAGE else f"tl_query_lens.{init.parent.name}"
        for init in inits
        if "lazy_package(" in init.read_text(encoding="utf-8")
    ]


@pytest.fixture()
def made_up(tmp_path, monkeypatch):
    """A package ``lazypkg`` whose names ``run`` (module ``lazypkg.run``, same name) and ``Value`` load lazily, with
    a ``first`` module that records that it ran."""
    root = tmp_path / "lazypkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        "from tl_query_lens.lazy import lazy_package\n"
        "__getattr__ = lazy_package(__name__, {'run': 'lazypkg.run', 'Value': 'lazypkg.values'},"
        " first=('lazypkg.first',))\n"
    )
    (root / "run.py").write_text("def run():\n    return 'the function'\n")
    (root / "values.py").write_text("Value = 42\n")
    (root / "first.py").write_text("import sys\nsys.modules['lazypkg'].first_ran = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [n for n in sys.modules if n == "lazypkg" or n.startswith("lazypkg.")]:
        del sys.modules[name]


def test_a_name_loads_its_module_on_first_use(made_up):
    package = importlib.import_module("lazypkg")
    assert "lazypkg.values" not in sys.modules and "lazypkg.first" not in sys.modules
    assert "Value" in dir(package)
    assert package.Value == 42
    assert "lazypkg.values" in sys.modules and package.first_ran
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        package.Missing  # noqa: B018


def test_a_submodule_of_the_same_name_does_not_hide_the_function(made_up):
    importlib.import_module("lazypkg.run")  # binds the submodule in its package, as any import of it does
    from lazypkg import run

    assert callable(run) and run() == "the function"


@pytest.mark.parametrize("name", lazy_packages())
def test_every_public_name_of_a_package_loads_from_its_module(name):
    package = importlib.import_module(name)
    exports = package.__dict__["_lazy_exports"]
    assert sorted(package.__all__) == sorted(exports), "__all__ and the map of public names differ"
    for public, module in exports.items():
        assert getattr(package, public) is getattr(importlib.import_module(module), public), f"{name}.{public}"


def test_the_packages_that_load_lazily():
    assert set(lazy_packages()) >= {
        "tl_query_lens",
        *(
            f"tl_query_lens.{p}"
            for p in ("atlas", "certify", "dictionaries", "operators", "query_lens", "readout", "reproduce", "saes")
        ),
    }
