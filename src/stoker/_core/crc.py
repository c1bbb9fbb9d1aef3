"""The CRC32C function of the ``crc32c`` distribution, loaded without its package's
``__init__``.

That ``__init__`` reads the distribution's own version from the installed metadata
(``importlib.metadata``, which imports ``email``, ``zipfile`` and ``csv`` and scans every
distribution on ``sys.path``): over 100 ms in a fresh interpreter with a full environment,
against under 1 ms for the compiled module alone. Every loader worker server pays its imports
before the first batch (docs/loader.md, "The first batch"), so the module is loaded here
directly from the package's folder and registered under its own name: a later
``import crc32c`` runs the package's ``__init__``, which finds it and uses the same function.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from types import ModuleType

__all__ = ["crc32c"]

_NAME = "crc32c._crc32c"


def _compiled() -> ModuleType:
    """``crc32c._crc32c``, from ``sys.modules`` or loaded from the package's folder (the
    package found, not imported); the package's own import where that fails."""
    mod = sys.modules.get(_NAME)
    if mod is not None:
        return mod
    pkg = importlib.util.find_spec("crc32c")
    if pkg is not None and pkg.submodule_search_locations:
        loaders = (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES)
        finder = importlib.machinery.FileFinder(list(pkg.submodule_search_locations)[0], loaders)
        spec = finder.find_spec(_NAME)
        if spec is not None and spec.loader is not None:
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            sys.modules[_NAME] = mod
            return mod
    import crc32c as package  # an unusual layout: the package's own way

    return package


crc32c = _compiled().crc32c
