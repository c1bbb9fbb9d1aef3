"""Layer 3: pack image folders, im2rec lists or listings into shards of any writable format,
convert a data set between formats; make sample data.

``stoker.pack`` is both this package and the function users call: once any submodule
(``stoker.pack.packer`` …) is imported, Python binds the *package* to the name ``stoker.pack``,
so the package itself is made callable and forwards to :func:`stoker.pack.packer.pack`.
"""

import sys
import types
from typing import Any

from stoker.pack.packer import PackOptions, PackReport, convert, pack, run_pack

__all__ = ["PackOptions", "PackReport", "convert", "make_sample_data", "pack", "run_pack"]


def __getattr__(name: str) -> Any:
    """``make_sample_data``, imported on first use: a pack or convert does not load it."""
    if name == "make_sample_data":
        from stoker.pack.sample_data import make_sample_data

        return make_sample_data
    raise AttributeError(f"module 'stoker.pack' has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        return pack(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
