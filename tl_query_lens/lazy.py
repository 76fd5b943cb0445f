"""Public names of a package that load on first use, so importing a package (or one of its torch-free ``config``
modules) runs none of its heavy modules.

A package's ``__init__.py`` maps each public name to the module that defines it and hands the map to
:func:`lazy_package`::

    _EXPORTS = {"certify": "tl_query_lens.certify.certify", "CertifyConfig": "tl_query_lens.certify.config"}
    __all__ = sorted(_EXPORTS)
    __getattr__ = lazy_package(__name__, _EXPORTS)

``from tl_query_lens.certify import certify`` then imports ``tl_query_lens.certify.certify`` at that moment and
binds the name in the package, and ``import tl_query_lens.certify.config`` imports that module alone. The package's
``TYPE_CHECKING`` block imports the same names for type checkers (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LazyPackage", "lazy_package"]


class LazyPackage(types.ModuleType):
    """A package module whose names in ``_lazy_exports`` are imported from their modules when first read."""

    def __getattr__(self, name: str) -> Any:
        exports = self.__dict__.get("_lazy_exports", {})
        if name not in exports:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        for module in self.__dict__.get("_lazy_first", ()):
            importlib.import_module(module)
        value = getattr(importlib.import_module(exports[name]), name)
        self.__dict__[name] = value
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(self.__dict__.get("_lazy_exports", {})))

    def __setattr__(self, name: str, value: Any) -> None:
        # Importing a submodule that shares a public name (``certify.certify``, ``readout.decompose``) binds the
        # submodule in its package: the public name (the function) is kept instead.
        if name in self.__dict__.get("_lazy_exports", {}) and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


def lazy_package(package: str, exports: Mapping[str, str], *, first: tuple[str, ...] = ()) -> Callable[[str], Any]:
    """Make the loaded module ``package`` load each name of ``exports`` (name → module defining it) on first use.

    Args:
        package: the package's ``__name__``.
        exports: public name → the module it is imported from.
        first: modules imported before any public name is read: those that register the package's SAELens
            architectures and local releases, so that using the package registers them as importing it once did.

    Returns:
        The package's ``__getattr__`` (bind it to that name: linters then know the names are defined).
    """
    module = sys.modules[package]
    module.__dict__["_lazy_exports"] = dict(exports)
    module.__dict__["_lazy_first"] = first
    module.__class__ = LazyPackage
    return module.__getattr__
