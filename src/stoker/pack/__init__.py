"""Layer 3: pack image folders, im2rec lists or listings into shards of any writable format,
convert a data set between formats; make sample data.

``stoker.pack`` is both this package and the function users call: once any submodule
(``stoker.pack.packer`` …) is imported, Python binds the *package* to the name ``stoker.pack``,
so the package itself is made callable and forwards to :func:`stoker.pack.packer.pack`.
"""

import sys
import types

from stoker.pack.packer import PackOptions, PackReport, convert, pack, run_pack
from stoker.pack.sample_data import make_sample_data

__all__ = ["PackOptions", "PackReport", "convert", "make_sample_data", "pack", "run_pack"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        return pack(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
