"""LMDB databases, read: Caffe ``Datum`` records and LSUN-style key -> image sets.

``open_reader(path, layout=None, label=None, labels=None, class_names=None, png_level=0)``
gives an :class:`LmdbReader`; ``verify(path, ...)`` checks every value; ``sniff(path)`` says
whether ``path`` is an LMDB database. Layouts, the key list cache and what counts as bad are in
this folder's README. The ``lmdb`` package is optional (``pip install "stoker[lmdb]"``) and is
imported only when a database is opened.
"""

from __future__ import annotations

import os

from stoker.formats.lmdb.datum import Datum, encode_png, image_kind, parse_datum
from stoker.formats.lmdb.location import LmdbFormatError, show_key
from stoker.formats.lmdb.reader import LmdbReader, open_reader
from stoker.formats.lmdb.verify import verify
from stoker.formats.spec import Format

__all__ = [
    "FORMAT",
    "Datum",
    "LmdbFormatError",
    "LmdbReader",
    "encode_png",
    "image_kind",
    "open_reader",
    "parse_datum",
    "show_key",
    "sniff",
    "verify",
]

_SUFFIXES = (".mdb", ".lmdb")
_L = "stoker.formats.lmdb"
#: The format, as the registry lists it (:mod:`stoker.formats.spec`): read only, local only.
FORMAT = Format(
    "lmdb",
    f"{_L}:open_reader",
    _SUFFIXES,
    verify=f"{_L}:verify",
    sniff=f"{_L}:sniff",
    roles={"data": "data.mdb"},
)


def sniff(path: str | os.PathLike[str]) -> bool:
    """True for a folder holding ``data.mdb``, or a ``*.mdb``/``*.lmdb`` file (opened with
    ``subdir=False``); nothing is opened."""
    p = os.fspath(path)
    if os.path.isdir(p):
        return os.path.isfile(os.path.join(p, "data.mdb"))
    return os.path.isfile(p) and p.lower().endswith(_SUFFIXES)
