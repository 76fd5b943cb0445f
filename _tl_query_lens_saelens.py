"""Register tl_query_lens' SAELens architectures (``ffkv``, ``readout``) and readout releases as soon as ``sae_lens``
is imported, so ``SAE.load_from_disk`` / ``SAE.from_pretrained`` work in a process that never imports tl_query_lens.

SAELens 6 has no plugin hook: its registry (``sae_lens.registry.SAE_CLASS_REGISTRY``) is a plain dict that a package
fills when it is imported. This module is therefore loaded at interpreter start by ``tl_query_lens-saelens.pth``
(a wheel install puts it in site-packages; ``scripts/setup.sh`` copies it there for an editable install). It only
appends a finder to ``sys.meta_path`` that waits for ``import sae_lens``; nothing else is imported until then.
Set ``TLQL_SAELENS_AUTOLOAD=0`` to switch it off.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys

TARGET = "sae_lens"
PACKAGE = "tl_query_lens"


class RegisterAfterSAELens(importlib.abc.MetaPathFinder):
    """One-shot finder: lets the normal machinery find ``sae_lens`` and imports tl_query_lens right after it runs."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # one shot, and keeps the lookup below from finding us again
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            register()

        spec.loader.exec_module = exec_then_register
        return spec


def register() -> None:
    """Import tl_query_lens' public names (which registers everything), unless one of its modules is being imported:
    then that module imported sae_lens, and the package registers what it loads itself."""
    if any(_initializing(module) for name, module in list(sys.modules.items()) if name.split(".")[0] == PACKAGE):
        return
    try:
        importlib.import_module(PACKAGE).load_all()
    except ImportError as err:  # a broken install must not break `import sae_lens`
        logging.getLogger(__name__).warning(
            "tl_query_lens is installed but could not be imported (%s); its SAELens architectures are not "
            "registered. Reinstall it, or set TLQL_SAELENS_AUTOLOAD=0 to silence this.",
            err,
        )


def _initializing(module: object) -> bool:
    """True while ``module`` runs its import (importlib marks its spec)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def install() -> None:
    """Called by the .pth file at interpreter start."""
    if os.environ.get("TLQL_SAELENS_AUTOLOAD", "1") == "0" or TARGET in sys.modules:
        return
    if not any(isinstance(f, RegisterAfterSAELens) for f in sys.meta_path):
        sys.meta_path.insert(0, RegisterAfterSAELens())
