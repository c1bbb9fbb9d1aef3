"""Protobuf varints: what ``encode_varint`` writes reads back, one to ten bytes."""

from __future__ import annotations

import pytest

from stoker.formats.protowire import encode_varint, read_varint

EDGES = [0, 1, 127, 128, 255, 16383, 16384, 2**21 - 1, 2**21, 2**35, 2**63 - 1, -1, -(2**63)]


@pytest.mark.parametrize("n", EDGES)
def test_a_varint_is_seven_bits_a_byte_and_reads_back(n):
    data = encode_varint(n)
    unsigned = n % (1 << 64)  # a negative int64: its two's complement, ten bytes
    assert len(data) == max(1, -(-unsigned.bit_length() // 7))
    assert all(b & 0x80 for b in data[:-1]) and not data[-1] & 0x80
    assert sum((b & 0x7F) << (7 * i) for i, b in enumerate(data)) == unsigned
    assert read_varint(memoryview(data), 0, len(data)) == (unsigned, len(data))
