"""insightface's MS1M layout of a ``.rec``: its header and identity records, and the image records alone.

insightface's ``face2rec`` writes a header record with key 0: ``flag = 2``, labels ``(a, b)``
and no image. Keys ``1 .. a-1`` are the images (each labelled with its identity); keys
``a .. b-1`` are one record per identity whose two labels give that identity's ``[start,
end)`` image keys (``MXFaceDataset``, ``face_image_iter``). :func:`detect_layout` recognises
it when a set of one local shard is opened (``RecordIOShard._find_layout``: the set's samples
are then the image records alone), and :func:`layout_table` gives the header
and identity records as JSON (what ``stoker unpack`` keeps beside the images and ``stoker
inspect`` counts as metadata records). :func:`layout_records` makes the header and identity
records for images keyed ``1..N`` (what ``stoker pack --layout insightface`` appends after the
images, in the order insightface's ``face2rec``/``dir2rec`` write them: images, then the
header, then the identities; ``id`` is 0 in the header and the record's key in an identity
record, ``id2`` 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError
from stoker.formats.recordio.header import IRHeader, pack_header
from stoker.formats.recordio.reader import RecordFile

__all__ = [
    "IDENTITY_TABLE",
    "Layout",
    "detect_layout",
    "layout_records",
    "layout_table",
]

#: the file ``stoker unpack`` writes beside an insightface set's images (its header and
#: identity records, :func:`layout_table`, with each identity's folder); ``stoker pack --layout
#: insightface`` takes the identities' order from it
IDENTITY_TABLE = "identities.json"


class Layout:
    """An insightface set's layout: ``ranges`` (int64 ``(n_identities, 2)``, the
    ``[start_key, end_key)`` of identity ``j`` in row ``j``), ``image_keys`` and
    ``image_positions`` (the keys and positions of the image records)."""

    __slots__ = ("image_keys", "image_positions", "ranges")

    def __init__(self, ranges: np.ndarray, image_keys: np.ndarray, image_positions: np.ndarray):
        self.ranges = ranges
        self.image_keys = image_keys
        self.image_positions = image_positions


def _header_labels(r: RecordFile) -> tuple[int, int, int] | None:
    """``(position, a, b)`` of a header record 0 with ``flag = 2`` integer labels
    ``1 <= a <= b`` and no image; ``None`` when record 0 is not one."""
    if len(r) == 0:
        return None
    try:
        p0 = r.position(0)
    except KeyError:
        return None
    try:
        h, img = r.read_header(p0)
    except CorruptRecordError:  # no IRHeader record (raw payloads): reads report it, if any
        return None
    if h.flag != 2 or len(img) != 0:
        return None
    a, b = (float(x) for x in np.asarray(h.label))
    if not (a.is_integer() and b.is_integer() and 1 <= a <= b):
        return None
    return p0, int(a), int(b)


def _identity_ranges(
    r: RecordFile,
    id_positions: np.ndarray,
    a: int,
    b: int,
    bad: Callable[[str], CorruptRecordError],
) -> np.ndarray:
    """The ``[start, end)`` image keys the identity records ``a .. b-1`` carry, checked."""
    if id_positions.shape[0] == 0:
        return np.zeros((0, 2), dtype=np.int64)
    try:
        lab = r.labels(id_positions)
    except ValueError as e:
        if isinstance(e, CorruptRecordError):
            raise
        raise bad(f"identity records {a}..{b - 1} do not all carry 2 labels") from None
    if lab.ndim != 2 or lab.shape[1] != 2 or not bool(np.all(lab == np.round(lab))):
        raise bad(f"identity records {a}..{b - 1} do not all carry 2 integer labels")
    ranges = lab.astype(np.int64)
    wrong = np.flatnonzero((ranges[:, 0] < 1) | (ranges[:, 1] > a) | (ranges[:, 0] > ranges[:, 1]))
    if wrong.size:
        j = int(wrong[0])
        raise CorruptRecordError(
            r.path,
            int(r.offsets[id_positions[j]]),
            f"insightface identity record: range {ranges[j].tolist()} lies outside the "
            f"image keys 1..{a - 1}",
            key=a + j,
        )
    return ranges


def detect_layout(r: RecordFile) -> Layout | None:
    """The insightface layout of ``r``, or ``None`` when its record 0 is no such header.

    Raises :class:`CorruptRecordError` when the header names keys the file lacks or an
    identity record is malformed.
    """
    head = _header_labels(r)
    if head is None:
        return None
    p0, a, b = head
    off = int(r.offsets[p0])

    def bad(reason: str) -> CorruptRecordError:
        return CorruptRecordError(r.path, off, f"insightface header record 0: {reason}", key=0)

    if b > len(r):
        raise bad(f"labels ({a}, {b}) name more records than the file holds ({len(r)})")
    try:
        image_positions = r.positions(np.arange(1, a, dtype=np.int64))
        id_positions = r.positions(np.arange(a, b, dtype=np.int64))
    except KeyError as e:
        raise bad(f"labels ({a}, {b}) name keys the .idx lacks ({e.args[0]})") from None
    ranges = _identity_ranges(r, id_positions, a, b, bad)
    return Layout(ranges, np.arange(1, a, dtype=np.int64), image_positions)


#: the largest key a float32 label holds exactly
_EXACT_KEYS = 1 << 24


def identity_runs(labels: np.ndarray) -> np.ndarray:
    """The ``[start, end)`` positions of each run of equal labels, in order (int64 ``(k,
    2)``); ``ValueError`` naming the label when an identity's images are not all in one run."""
    lab = np.asarray(labels, dtype=np.float64).reshape(-1)
    if lab.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    starts = np.concatenate([[0], np.flatnonzero(lab[1:] != lab[:-1]) + 1])
    ends = np.concatenate([starts[1:], [lab.size]])
    seen, first = np.unique(lab[starts], return_counts=True)
    split = seen[first > 1]
    if split.size:
        raise ValueError(
            f"the images labelled {split[0]:g} are not in one run of keys; an insightface "
            "identity record holds one [start, end) range"
        )
    return np.stack([starts, ends], axis=1).astype(np.int64)


def layout_records(labels: np.ndarray) -> list[tuple[int, bytes]]:
    """``(key, payload)`` of the header record and the identity records for images keyed
    ``1..N`` whose labels, in key order, are ``labels`` (each identity's images one run).

    Header: key 0, ``IRHeader(flag=2, label=(N+1, N+1+K), id=0, id2=0)``, no image; identity
    ``j``: key ``N+1+j``, ``IRHeader(2, (start_key, end_key), id=key, 0)``, no image.
    """
    runs = identity_runs(labels) + 1  # positions 0..N-1 are keys 1..N
    a = int(np.asarray(labels).size) + 1
    b = a + int(runs.shape[0])
    if b > _EXACT_KEYS:
        raise ValueError(
            f"{a - 1} images and {b - a} identities need keys up to {b - 1}; the header's "
            f"float32 labels hold keys exactly only up to {_EXACT_KEYS} (2**24)"
        )
    out = [(0, pack_header(IRHeader(2, np.array([a, b], np.float32), 0, 0)))]
    for j, (s, e) in enumerate(runs.tolist()):
        key = a + j
        out.append((key, pack_header(IRHeader(2, np.array([s, e], np.float32), key, 0))))
    return out


def layout_table(f: RecordFile, layout: Layout) -> dict[str, Any]:
    """The header and identity records of the insightface ``layout`` of ``f`` as a JSON-safe
    dict.

    ``{"layout": "insightface", "records": all records, "header": {"key": 0, "flag",
    "label": [a, b], "id", "id2"}, "image_keys": [1, a], "identities": [{"key": a + j,
    "start_key", "end_key"}, ...]}``: key ranges are ``[start, end)``, row ``j`` is identity
    ``j`` (face2rec labels its images ``j``); ``metadata_records`` counts the header, the
    identity records and any other record that is no image.
    """
    ranges = layout.ranges
    header, _ = f.read_header(f.position(0))
    a, b = (int(x) for x in np.asarray(header.label))
    n_images = a - 1
    return {
        "layout": "insightface",
        "records": len(f),
        "metadata_records": len(f) - n_images,
        "header": {
            "key": 0,
            "flag": int(header.flag),
            "label": [a, b],
            "id": int(header.id),
            "id2": int(header.id2),
        },
        "image_keys": [1, a],
        "identities": [
            {"key": a + j, "start_key": int(s), "end_key": int(e)}
            for j, (s, e) in enumerate(ranges.tolist())
        ],
    }
