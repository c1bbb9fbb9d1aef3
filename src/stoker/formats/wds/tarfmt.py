"""The tar format, read and written without ``tarfile``: 512-byte header blocks, checked before
anything they claim is believed.

Reading (:func:`walk`) understands what Python's ``tarfile``, GNU tar and the ``webdataset``
package write: POSIX ustar (``prefix`` + ``name``), GNU long names (``L``/``K`` members),
pax extended headers (``x``: ``path``, ``linkpath``, ``size``; a global ``g`` header is
parsed and ignored unless it sets a path or a size, which is refused), numbers in octal or
GNU base-256. Every header's checksum is verified (the unsigned sum of its bytes with the
checksum field read as spaces; the historic signed sum is accepted too, as ``tarfile`` does).
A size that runs past the end of the file is an error naming the header's offset, raised
before any byte of the member is touched; nothing is ever allocated from a header's word.

Writing (:func:`ustar_header`) produces plain ustar headers with fixed metadata (mode 0444,
uid/gid 0, empty user and group names, mtime 0) so the same samples give the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "RECORD",
    "Member",
    "TarError",
    "Walk",
    "checksum",
    "padding",
    "ustar_header",
    "ustar_headers",
    "walk",
]

BLOCK = 512
#: ``tarfile`` and GNU tar pad an archive to a multiple of this (20 blocks); so does the writer.
RECORD = 20 * BLOCK
ZERO_BLOCK = bytes(BLOCK)
END_OF_ARCHIVE = bytes(2 * BLOCK)
#: GNU long names and pax headers larger than this are refused before they are read.
MAX_META_BYTES = 1 << 20

# type flags
REGULAR = (b"0", b"\x00", b"7")  # 7: contiguous file, read as a regular one
DIRECTORY = b"5"
_LONGNAME, _LONGLINK, _PAX, _PAX_GLOBAL = b"L", b"K", b"x", b"g"
_KIND = {
    b"1": "hard link",
    b"2": "symbolic link",
    b"3": "character device",
    b"4": "block device",
    b"6": "FIFO",
    b"S": "GNU sparse file",
    b"V": "volume label",
    b"M": "multi-volume continuation",
    b"D": "GNU dump directory",
}
_USTAR = b"ustar\x00"
_GNU = b"ustar  \x00"
_PAX_RECORD = re.compile(rb"(\d+) ")


class TarError(ValueError):
    """A header that cannot be trusted; the walk cannot go on past it. ``offset``: the byte
    offset of the header (or the data) at fault; ``truncated``: the file ends inside it."""

    def __init__(self, offset: int, reason: str, *, truncated: bool = False) -> None:
        self.offset, self.reason, self.truncated = offset, reason, truncated
        super().__init__(f"byte offset {offset}: {reason}")


@dataclass(frozen=True)
class Member:
    """One archive member: where its first header starts (a pax or GNU long-name header when
    there is one), where its data starts, its size, raw name and link target, and its type
    flag (``b"0"`` regular, ``b"5"`` folder, ``b"2"`` symlink, ...)."""

    header: int
    data: int
    size: int
    name: bytes
    type: bytes
    link: bytes = b""

    @property
    def regular(self) -> bool:
        return self.type in REGULAR

    @property
    def kind(self) -> str:
        if self.regular:
            return "regular file"
        if self.type == DIRECTORY:
            return "directory"
        return _KIND.get(self.type, f"member of unknown type {self.type!r}")


def padding(size: int) -> int:
    """Bytes of zero padding after ``size`` bytes of member data."""
    return -size % BLOCK


def unsigned_sum(header: bytes | bytearray) -> int:
    """The spec's checksum of a 512-byte header: the unsigned sum of its bytes with the
    checksum field taken as 8 spaces."""
    return sum(header) - sum(header[148:156]) + 8 * 32


def checksum(header: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(unsigned, signed) sums of a 512-byte header with its checksum field as 8 spaces."""
    h = bytes(header)
    unsigned = unsigned_sum(h)
    high = sum(1 for b in h[:148] if b > 127) + sum(1 for b in h[156:] if b > 127)
    return unsigned, unsigned - 256 * high


def _nts(field: bytes) -> bytes:
    """A NUL-terminated string field."""
    end = field.find(b"\x00")
    return field if end < 0 else field[:end]


def _number(field: bytes, what: str, offset: int) -> int:
    """An octal (or GNU base-256) number field."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            value -= 1 << (8 * (len(field) - 1))
        return value
    text = _nts(field).strip(b" ")
    if not text:
        return 0
    if text.translate(None, b"01234567"):
        raise TarError(offset, f"the header's {what} field {field!r} is not an octal number")
    return int(text, 8)


@dataclass
class Walk:
    """The state of one :func:`walk`: ``end`` is the offset of the end-of-archive marker once
    it is found (``None`` if the file ended without one), ``headers`` counts the checksums
    verified, ``lone_zero`` is true when the marker was a single zero block at the end."""

    path: str
    size: int
    end: int | None = None
    headers: int = 0
    lone_zero: bool = False


def _header_at(view: memoryview, pos: int, state: Walk) -> bytes | None:
    """The checked header block at ``pos``; ``None`` at the end-of-archive marker."""
    if pos + BLOCK > state.size:
        raise TarError(
            pos,
            f"the file ends {state.size - pos} bytes into a 512-byte header: it was cut short",
            truncated=True,
        )
    block = bytes(view[pos : pos + BLOCK])
    if block == ZERO_BLOCK:
        state.end = pos
        state.lone_zero = pos + 2 * BLOCK > state.size
        return None
    stored = _number(block[148:156], "checksum", pos)
    unsigned = unsigned_sum(block)
    if stored != unsigned and stored != checksum(block)[1]:
        raise TarError(
            pos,
            f"header checksum mismatch: the header says {stored:o} (octal), its bytes sum to "
            f"{unsigned:o}; the header is damaged or this is not a tar file",
        )
    state.headers += 1
    return block


def _pax_records(data: bytes, offset: int) -> dict[bytes, bytes]:
    """The ``"%d key=value\\n"`` records of a pax header's data, bounds-checked."""
    out: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        m = _PAX_RECORD.match(data, pos)
        length = int(m.group(1)) if m else 0
        if not m or length < len(m.group(0)) + 2 or pos + length > len(data):
            raise TarError(offset, f"pax header record at byte {pos} of its data is malformed")
        record = data[m.end() : pos + length]
        if not record.endswith(b"\n") or b"=" not in record:
            raise TarError(offset, f"pax header record at byte {pos} of its data is malformed")
        key, _, value = record[:-1].partition(b"=")
        out[key] = value
        pos += length
    return out


def _meta_data(view: memoryview, pos: int, size: int, state: Walk, what: str) -> bytes:
    if size > MAX_META_BYTES:
        raise TarError(pos, f"{what} of {size} bytes is over the {MAX_META_BYTES}-byte limit")
    data = pos + BLOCK
    if data + size > state.size:
        raise TarError(
            pos,
            f"{what} claims {size} bytes but the file ends at {state.size}: it was cut short",
            truncated=True,
        )
    return bytes(view[data : data + size])


def walk(view: memoryview, size: int, state: Walk) -> Iterator[Member]:
    """The members of the tar in ``view`` (``size`` bytes), in order; stops at the end-of-
    archive marker or at the end of the file (``state.end`` tells which). Raises
    :class:`TarError` at the first header that cannot be trusted."""
    pos = 0
    first = 0
    long_name: bytes | None = None
    long_link: bytes | None = None
    pax: dict[bytes, bytes] = {}
    while pos < size:
        block = _header_at(view, pos, state)
        if block is None:
            return
        tflag = block[156:157]
        msize = _number(block[124:136], "size", pos)
        if msize < 0:
            raise TarError(pos, f"the header's size field is negative ({msize})")
        if tflag in (_LONGNAME, _LONGLINK, _PAX, _PAX_GLOBAL):
            data = _meta_data(view, pos, msize, state, f"{tflag.decode()} header data")
            if tflag == _LONGNAME:
                long_name = _nts(data)
            elif tflag == _LONGLINK:
                long_link = _nts(data)
            elif tflag == _PAX:
                pax.update(_pax_records(data, pos))
            else:
                glob = _pax_records(data, pos)
                if b"path" in glob or b"size" in glob:
                    raise TarError(pos, "a pax global header that sets a path or a size")
            pos += BLOCK + msize + padding(msize)
            continue
        if b"size" in pax:
            text = pax[b"size"]
            if not text.isdigit():
                raise TarError(first, f"pax size {text!r} is not a number")
            msize = int(text)
        name = _nts(block[0:100])
        if block[257:263] == _USTAR and block[345] != 0:
            name = _nts(block[345:500]) + b"/" + name
        if long_name is not None:
            name = long_name
        if b"path" in pax:
            name = pax[b"path"]
        link = pax.get(b"linkpath", long_link if long_link is not None else _nts(block[157:257]))
        if any(k.startswith(b"GNU.sparse") for k in pax):
            tflag = b"S"
        data_off = pos + BLOCK
        stored = (
            msize if tflag in REGULAR or tflag not in (b"1", b"2", b"3", b"4", b"5", b"6") else 0
        )
        if stored > size - data_off:
            raise TarError(
                first,
                f"member {name!r} claims {stored} bytes of data at byte offset {data_off} but "
                f"the file ends at {size}: the member was cut short or its size field is "
                "corrupt",
                truncated=True,
            )
        yield Member(first, data_off, stored, name, tflag, link)
        pos = data_off + stored + padding(stored)
        first = pos
        long_name = long_link = None
        pax = {}
    state.end = None


def _octal(value: int, width: int) -> bytes:
    """``value`` as ``width - 1`` octal digits and a NUL, as ustar stores numbers."""
    digits = f"{value:0{width - 1}o}".encode("ascii")
    if len(digits) > width - 1:
        raise ValueError(f"{value} does not fit a {width}-byte tar number field")
    return digits + b"\x00"


def ustar_header(name: bytes, size: int) -> bytes:
    """The 512-byte ustar header of a regular member ``name`` (at most 100 bytes, no prefix
    split) of ``size`` bytes with stoker's fixed metadata (see the module docstring)."""
    if not name or len(name) > 100 or b"\x00" in name:
        raise ValueError(f"tar member name {name!r} must be 1..100 bytes without NUL")
    if size >= 8**11:
        raise ValueError(f"a tar member of {size} bytes is over ustar's 8 GiB limit")
    size_field = _octal(size, 12)
    total = _TEMPLATE_SUM + sum(name) + sum(size_field)  # the template's, checksum as spaces
    return b"".join(
        (
            name,
            bytes(100 - len(name)),
            _TEMPLATE[100:124],
            size_field,
            _TEMPLATE[136:148],
            f"{total:06o}".encode("ascii") + b"\x00 ",
            _TEMPLATE[156:],
        )
    )


def ustar_headers(names: Sequence[bytes], sizes: np.ndarray) -> bytes:
    """:func:`ustar_header` of each ``(names[j], sizes[j])``, 512 bytes each, one after
    another, made as one array; the same ``ValueError`` for a name or size it refuses."""
    n = len(names)
    size = np.asarray(sizes, dtype=np.int64).reshape(-1)
    lengths = np.fromiter(map(len, names), np.int64, n)
    if n != size.shape[0]:
        raise ValueError(f"{n} tar member names for {size.shape[0]} sizes")
    if n == 0:
        return b""
    if lengths.min() < 1 or lengths.max() > 100 or b"\x00" in b"".join(names):
        bad = next(m for m in names if not m or len(m) > 100 or b"\x00" in m)
        raise ValueError(f"tar member name {bad!r} must be 1..100 bytes without NUL")
    if size.min() < 0 or size.max() >= 8**11:
        raise ValueError(f"a tar member of {int(size.max())} bytes is over ustar's 8 GiB limit")
    h = np.frombuffer(_TEMPLATE, np.uint8)[None, :].repeat(n, axis=0)
    h[:, :100] = np.frombuffer(b"".join([m.ljust(100, b"\x00") for m in names]), np.uint8).reshape(
        n, 100
    )
    h[:, 124:135] = ((size[:, None] >> _SHIFTS11) & 7) + 48  # 11 octal digits, then the NUL
    total = _TEMPLATE_SUM + h[:, :100].sum(axis=1, dtype=np.int64)
    total += h[:, 124:136].sum(axis=1, dtype=np.int64)
    h[:, 148:154] = ((total[:, None] >> _SHIFTS6) & 7) + 48
    h[:, 154] = 0
    h[:, 155] = 32
    return h.tobytes()


_SHIFTS11 = 3 * np.arange(10, -1, -1)
_SHIFTS6 = 3 * np.arange(5, -1, -1)


def _template() -> bytes:
    """A header with stoker's fixed metadata, no name, size and checksum (zeros there)."""
    h = bytearray(BLOCK)
    h[100:108] = _octal(0o444, 8)
    h[108:116] = _octal(0, 8)
    h[116:124] = _octal(0, 8)
    h[136:148] = _octal(0, 12)
    h[156:157] = b"0"
    h[257:263] = _USTAR
    h[263:265] = b"00"
    h[329:337] = _octal(0, 8)
    h[337:345] = _octal(0, 8)
    return bytes(h)


_TEMPLATE = _template()
_TEMPLATE_SUM = unsigned_sum(_TEMPLATE)
