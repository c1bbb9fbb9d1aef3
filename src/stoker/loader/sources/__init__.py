"""Where samples come from: every source the loader reads is a :class:`~stoker.formats.Reader`
(the one read contract): any registered format through ``stoker.formats.open``, an image folder
(:class:`FolderSource`), arrays in shared memory (:class:`ArraySource`). :func:`as_source`
picks one for what ``Loader`` is given; :class:`RecordSource` is RecordIO's reader with the
loader's defaults; ``Source`` is ``Reader`` under the loader's older name.
"""

from __future__ import annotations

from stoker.loader.sources.arrays import ArraySource
from stoker.loader.sources.base import Source
from stoker.loader.sources.folder import FolderSource
from stoker.loader.sources.opening import as_source
from stoker.loader.sources.records import RecordSource

__all__ = ["ArraySource", "FolderSource", "RecordSource", "Source", "as_source"]
