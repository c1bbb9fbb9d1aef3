"""The reason each record guard gives, so that a guard removed (F-13) is told apart from the
layer behind it: a length past the end of the file, and an IRHeader label count larger than the
record, are each refused by their own check, before anything is allocated from them."""

from __future__ import annotations

import struct

import pytest
from _reliability_util import load_corpus_module

from stoker._core.errors import CorruptRecordError
from stoker.formats.recordio.seam import RecordIOReader


@pytest.fixture()
def damaged(tmp_path):
    mfc = load_corpus_module()
    mfc.write_set(tmp_path, mfc.base_payloads(), manifest=False)
    offsets = mfc.record_offsets(tmp_path)
    rec = tmp_path / f"{mfc.NAME}.rec"

    def patch(rel: int, data: bytes) -> tuple[str, int]:
        off = offsets[mfc.PLAIN_KEY]
        raw = bytearray(rec.read_bytes())
        raw[off + rel : off + rel + len(data)] = data
        rec.write_bytes(bytes(raw))
        return str(rec), off

    return patch, mfc.PLAIN_KEY


def _read_all(path: str) -> None:
    r = RecordIOReader(path, checksums=False)
    try:
        for i in range(len(r)):
            r.read(i)
    finally:
        r.close()


@pytest.mark.parametrize("length", [0x1FFFFFFF, 1 << 28])
def test_a_length_past_the_end_of_the_file_is_refused_by_the_length_bound(damaged, length):
    patch, key = damaged
    path, off = patch(4, struct.pack("<I", length))  # cflag 0: the word is the length
    with pytest.raises(CorruptRecordError, match="runs past the end of the file") as e:
        _read_all(path)
    assert (e.value.key, e.value.offset) == (key, off)


@pytest.mark.parametrize("flag", [1 << 31, 1 << 20])
def test_an_irheader_label_count_larger_than_the_record_is_refused_by_the_flag_bound(damaged, flag):
    patch, key = damaged
    path, off = patch(8, struct.pack("<I", flag))
    with pytest.raises(CorruptRecordError, match=rf"IRHeader flag {flag} asks for {flag}") as e:
        _read_all(path)
    assert (e.value.key, e.value.offset) == (key, off)


def test_a_changed_padding_byte_is_found_by_verify(tmp_path):
    """No checksum covers the zero padding after a payload; verify checks it is still zero."""
    from stoker.formats.recordio import verify_records

    mfc = load_corpus_module()
    payloads = mfc.base_payloads()
    k = next(i for i, p in enumerate(payloads) if (24 + len(p)) % 4)  # a record with padding
    mfc.write_set(tmp_path, payloads, manifest=False)
    rec = tmp_path / f"{mfc.NAME}.rec"
    off = mfc.record_offsets(tmp_path)[k]
    length = int.from_bytes(rec.read_bytes()[off + 4 : off + 8], "little")
    raw = bytearray(rec.read_bytes())
    raw[off + 8 + length] ^= 0x10
    rec.write_bytes(bytes(raw))
    report = verify_records(rec, checksums=True, progress=False)
    assert [(p.key, p.offset) for p in report.problems] == [(k, off)]
    assert "padding" in report.problems[0].reason
