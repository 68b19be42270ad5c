"""Tests for phalanx.net.framing: round trips under any chunking, and hostile byte streams."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.net.framing import (
    HEADER_SIZE,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    TruncatedFrame,
    encode_frame,
)

MAX = 64


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _decode_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        decoder.feed(chunk)
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    return out


@given(
    payloads=st.lists(st.binary(max_size=MAX), max_size=20),
    cuts=st.lists(st.integers(min_value=0), max_size=30),
)
def test_any_chunking_round_trips(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(p, max_frame_size=MAX) for p in payloads)
    decoder = FrameDecoder(max_frame_size=MAX)
    assert _decode_all(decoder, _chunks(stream, cuts)) == payloads
    assert decoder.buffered == 0
    decoder.eof()  # a stream that ends on a frame boundary is clean


@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(min_value=0), max_size=10))
def test_random_bytes_raise_only_frame_error(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_size=MAX)
    try:
        frames = _decode_all(decoder, _chunks(data, cuts))
        decoder.eof()
    except FrameError:
        return
    # Accepted streams are exactly a concatenation of frames.
    assert b"".join(encode_frame(f, max_frame_size=MAX) for f in frames) == data


def test_encoding_is_big_endian_length_prefix() -> None:
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert encode_frame(b"") == b"\x00\x00\x00\x00"


def test_oversized_header_is_refused_before_the_payload_arrives() -> None:
    decoder = FrameDecoder(max_frame_size=MAX)
    decoder.feed(struct.pack(">I", MAX + 1))
    with pytest.raises(FrameTooLarge) as info:
        decoder.next_frame()
    assert info.value.length == MAX + 1
    assert decoder.buffered == 0


def test_frame_of_exactly_max_size_is_accepted() -> None:
    decoder = FrameDecoder(max_frame_size=MAX)
    decoder.feed(encode_frame(b"x" * MAX, max_frame_size=MAX))
    assert decoder.next_frame() == b"x" * MAX


def test_decoder_is_poisoned_after_an_error() -> None:
    decoder = FrameDecoder(max_frame_size=MAX)
    decoder.feed(b"\xff\xff\xff\xff")
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()
    with pytest.raises(FrameTooLarge):
        decoder.feed(encode_frame(b"ok"))
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()
    with pytest.raises(FrameTooLarge):
        decoder.eof()


@pytest.mark.parametrize("partial", [b"\x00", b"\x00\x00\x00\x05ab"])
def test_stream_ending_inside_a_frame_is_truncated(partial: bytes) -> None:
    decoder = FrameDecoder(max_frame_size=MAX)
    decoder.feed(partial)
    assert decoder.next_frame() is None
    with pytest.raises(TruncatedFrame):
        decoder.eof()


def test_eof_detects_an_oversized_header() -> None:
    decoder = FrameDecoder(max_frame_size=MAX)
    decoder.feed(struct.pack(">I", MAX + 1)[:HEADER_SIZE])
    with pytest.raises(FrameTooLarge):
        decoder.eof()


def test_eof_with_an_unread_complete_frame_is_caller_misuse() -> None:
    decoder = FrameDecoder(max_frame_size=MAX)
    decoder.feed(encode_frame(b"hi"))
    with pytest.raises(ValueError, match="pending"):
        decoder.eof()
    assert decoder.next_frame() == b"hi"  # misuse did not consume the frame


def test_own_oversized_payload_is_a_local_error() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        encode_frame(b"x" * (MAX + 1), max_frame_size=MAX)


@pytest.mark.parametrize("bad", [0, -1, 2**32])
def test_max_frame_size_is_validated(bad: int) -> None:
    with pytest.raises(ValueError, match="max_frame_size"):
        FrameDecoder(max_frame_size=bad)
    with pytest.raises(ValueError, match="max_frame_size"):
        encode_frame(b"", max_frame_size=bad)
