"""The tar format: the member walk is the standard library's ``tarfile`` with the guards it
lacks; headers are written by stoker with fixed metadata.

Reading (:func:`walk`) is ``tarfile``'s: POSIX ustar, GNU long names, pax extended headers,
octal or GNU base-256 numbers, each header's checksum verified (unsigned or the historic signed
sum). Around it: a member whose size is negative or runs past the end of the file is an error
naming the member and its header's offset, raised before any byte of the member is touched;
an extended header over :data:`MAX_META_BYTES` is refused before it is read; a pax size that is
not a number, a pax global header that sets a path or a size, and GNU sparse members are
refused; where ``tarfile`` stops early (a damaged header, a file cut inside a header) the stop
is an error naming the offset, not a silent end of the archive.

Writing (:func:`ustar_header`) produces plain ustar headers with fixed metadata (mode 0444,
uid/gid 0, empty user and group names, mtime 0) so the same samples give the same bytes.
"""

from __future__ import annotations

import tarfile
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
END_OF_ARCHIVE = bytes(2 * BLOCK)
#: GNU long names and pax headers larger than this are refused before they are read.
MAX_META_BYTES = 1 << 20
DIRECTORY = tarfile.DIRTYPE
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, folders, FIFOs
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
#: (unsigned, signed) sums of a 512-byte header with its checksum field as 8 spaces.
checksum = tarfile.calc_chksums  # type: ignore[attr-defined]


class TarError(ValueError):
    """A header that cannot be trusted; the walk cannot go on past it. ``offset``: the byte
    offset of the header at fault."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset, self.reason = offset, reason
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
        return self.type in tarfile.REGULAR_TYPES and self.type != tarfile.GNUTYPE_SPARSE

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


@dataclass
class Walk:
    """The state of one :func:`walk`: ``end`` is the offset of the end-of-archive marker once
    it is found (``None`` if the file ended without one), ``headers`` counts the members whose
    header checksums were verified."""

    path: str
    size: int
    end: int | None = None
    headers: int = 0


class _Reads:
    """The file face ``tarfile`` reads a mapped tar through: a read never goes past the end of
    the file, and one larger than an extended header may be is refused before it is made
    (``tarfile`` reads only headers and extended-header data; member data is skipped)."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.pos = view, 0

    def seek(self, pos: int) -> None:
        self.pos = pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int) -> bytes:
        if n > MAX_META_BYTES:
            raise TarError(
                self.pos - BLOCK,
                f"an extended header of {n} bytes is over the {MAX_META_BYTES}-byte limit",
            )
        out = bytes(self.view[self.pos : self.pos + n])
        self.pos += len(out)
        return out


#: What ``tarfile`` raises (or lets escape) on a header it cannot read.
_UNREADABLE = (tarfile.TarError, ValueError, IndexError)


def _open(view: memoryview) -> tarfile.TarFile:
    return tarfile.TarFile(fileobj=_Reads(view), encoding="utf-8", errors="surrogateescape")  # type: ignore[arg-type]


def _member(ti: tarfile.TarInfo, size: int, tar: tarfile.TarFile) -> Member:
    """``ti`` as a :class:`Member`, once the guards ``tarfile`` lacks have passed."""
    raw = ti.name.encode("utf-8", "surrogateescape")
    if ti.size < 0:
        raise TarError(ti.offset, f"the header's size field is negative ({ti.size})")
    if not ti.pax_headers.get("size", "0").isdigit():
        raise TarError(ti.offset, f"pax size {ti.pax_headers['size']!r} is not a number")
    if "path" in tar.pax_headers or "size" in tar.pax_headers:
        raise TarError(ti.offset, "a pax global header that sets a path or a size")
    sparse = any(k.startswith("GNU.sparse") for k in ti.pax_headers)
    stored = 0 if ti.type in _NO_DATA else ti.size
    if stored > size - ti.offset_data:
        raise TarError(
            ti.offset,
            f"member {raw!r} claims {stored} bytes of data at byte offset {ti.offset_data} but "
            f"the file ends at {size}: the member was cut short or its size field is corrupt",
        )
    link = ti.linkname.encode("utf-8", "surrogateescape")
    return Member(ti.offset, ti.offset_data, stored, raw, b"S" if sparse else ti.type, link)


def _stop(view: memoryview, size: int, pos: int, state: Walk) -> None:
    """Why the walk stopped at ``pos``: the end of the file (no end-of-archive marker), the
    marker (``state.end``), or a header that cannot be trusted (a :class:`TarError`)."""
    if pos >= size:
        return
    if pos + BLOCK > size:
        raise TarError(
            pos, f"the file ends {size - pos} bytes into a 512-byte header: it was cut short"
        )
    if not any(view[pos : pos + BLOCK]):
        state.end = pos
        return
    try:  # read from here, the header is the first one, and tarfile says why it fails
        _open(view[pos:])
        reason = "unreadable header"
    except TarError:
        raise
    except _UNREADABLE as e:
        reason = str(e) or type(e).__name__
    if reason == "bad checksum":
        raise TarError(
            pos, "header checksum mismatch: the header is damaged or this is not a tar file"
        )
    raise TarError(
        pos,
        f"the header does not parse ({reason}): a number field that is not an octal number or "
        "a malformed extended header; the header is damaged or this is not a tar file",
    )


def walk(view: memoryview, size: int, state: Walk) -> Iterator[Member]:
    """The members of the tar in ``view`` (``size`` bytes), in order; stops at the end-of-
    archive marker or at the end of the file (``state.end`` tells which). Raises
    :class:`TarError` at the first header that cannot be trusted."""
    pos = 0
    try:
        tar = _open(view[:size])
        while (ti := tar.next()) is not None:
            tar.members.clear()  # type: ignore[attr-defined]  # a member is yielded, not kept
            state.headers += 1
            yield _member(ti, size, tar)
            pos = tar.offset
    except TarError:
        raise
    except _UNREADABLE:
        pass
    _stop(view, size, pos, state)


def _octal(value: int, width: int) -> bytes:
    """``value`` as ``width - 1`` octal digits and a NUL, as ustar stores numbers."""
    return tarfile.itn(value, width, tarfile.USTAR_FORMAT)  # type: ignore[attr-defined,no-any-return]


def ustar_header(name: bytes, size: int) -> bytes:
    """The 512-byte ustar header of a regular member ``name`` (at most 100 bytes, no prefix
    split) of ``size`` bytes with stoker's fixed metadata (see the module docstring); what
    ``TarInfo.tobuf`` writes but for the device fields, which stoker fills with octal zeros,
    at a tenth of its cost."""
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
    h[257:265] = tarfile.POSIX_MAGIC
    h[329:337] = _octal(0, 8)
    h[337:345] = _octal(0, 8)
    return bytes(h)


_TEMPLATE = _template()
_TEMPLATE_SUM = checksum(_TEMPLATE)[0]
