"""The record format and the torn-tail / corruption classifier (pure)."""

from __future__ import annotations

import struct
from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.storage.records import HEADER_SIZE, decode_span, encode, encode_into, scan

payload_lists = st.lists(st.binary(max_size=40), min_size=1, max_size=8)
fast = settings(max_examples=150, deadline=None)


def _file(payloads: list[bytes], first: int = 1) -> tuple[bytes, list[int]]:
    data, offsets = b"", []
    for k, p in enumerate(payloads):
        offsets.append(len(data))
        data += encode(first + k, p)
    return data, offsets


@fast
@given(payload_lists, st.integers(1, 10**12))
def test_roundtrip(payloads: list[bytes], first: int) -> None:
    data, offsets = _file(payloads, first)
    res = scan(data, first)
    assert (list(res.offsets), res.valid_end, res.torn, res.corrupt_offset) == (
        offsets, len(data), False, None)
    assert decode_span(data, 0, offsets, first) == (payloads, None, "")


@fast
@given(payload_lists, st.integers(1, 10**12), st.integers(0, 1000), st.integers(0, 400))
def test_encode_into_fills_the_room_with_what_encode_gives(payloads: list[bytes], first: int,
                                                          pos: int, room: int) -> None:
    records = [(first + k, p) for k, p in enumerate(payloads)]
    out, offsets = bytearray(), array("q")
    nxt, end = encode_into(records, 0, out, offsets, pos, room)
    data, rel = _file(payloads[:nxt], first)
    assert bytes(out) == data
    assert list(offsets) == [pos + r for r in rel]
    assert end == pos + len(data)
    assert nxt >= 1  # the first record always goes, whatever the room
    assert len(out) <= room or nxt == 1
    if nxt < len(payloads):
        assert len(out) + HEADER_SIZE + len(payloads[nxt]) > room


@fast
@given(payload_lists, st.data())
def test_every_strict_prefix_is_a_torn_tail(payloads: list[bytes], data: st.DataObject) -> None:
    raw, offsets = _file(payloads)
    cut = data.draw(st.integers(0, len(raw) - 1))
    res = scan(raw[:cut], 1)
    whole = [o for k, o in enumerate(offsets) if o + HEADER_SIZE + len(payloads[k]) <= cut]
    assert list(res.offsets) == whole
    assert res.corrupt_offset is None
    assert res.torn == (cut != res.valid_end)


@fast
@given(payload_lists, st.integers(1, 64))
def test_zero_filled_tail_is_torn(payloads: list[bytes], zeros: int) -> None:
    raw, _offsets = _file(payloads)
    res = scan(raw + bytes(zeros), 1)
    assert (len(res.offsets), res.torn, res.corrupt_offset) == (len(payloads), True, None)


@fast
@given(payload_lists, st.data())
def test_single_bit_flip_is_corruption_of_that_record(payloads: list[bytes],
                                                      data: st.DataObject) -> None:
    raw, offsets = _file(payloads)
    pos = data.draw(st.integers(0, len(raw) - 1))
    bad = bytearray(raw)
    bad[pos] ^= 1 << data.draw(st.integers(0, 7))
    hit = max(o for o in offsets if o <= pos)
    res = scan(bytes(bad), 1)
    assert res.corrupt_offset == hit
    assert not res.torn
    assert list(res.offsets) == [o for o in offsets if o < hit]


def test_huge_length_with_valid_header_crc_is_bounded() -> None:
    raw = encode(1, b"x" * 100)
    res = scan(raw, 1, max_record_bytes=50)
    assert res.corrupt_offset == 0
    assert "exceeds" in res.reason


def test_huge_length_without_valid_crc_is_not_trusted() -> None:
    raw = bytearray(encode(1, b"abc") + encode(2, b"def"))
    struct.pack_into("<I", raw, 0, 0xFFFFFFF0)
    res = scan(bytes(raw), 1)
    assert (res.corrupt_offset, res.reason) == (0, "header checksum mismatch")


def test_wrong_index_is_corruption() -> None:
    raw = encode(1, b"a") + encode(3, b"c")
    res = scan(raw, 1)
    assert res.corrupt_offset == len(encode(1, b"a"))
    assert "expected 2" in res.reason


def test_garbage_after_records_is_corruption_not_torn() -> None:
    raw = encode(1, b"a") + b"\x01" + bytes(30)
    assert scan(raw, 1).corrupt_offset == len(encode(1, b"a"))


def test_decode_span_detects_rot() -> None:
    raw, offsets = _file([b"aa", b"bb"])
    bad = bytearray(raw)
    bad[-1] ^= 1
    assert decode_span(bytes(bad), 0, offsets, 1) == ([b"aa"], offsets[1],
                                                      "checksum or index mismatch on read")
