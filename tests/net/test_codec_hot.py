"""`Registry.encoder()` and `Registry.decoder()`: the hot-path forms of `encode` and `decode`
give the same bytes, the same objects and the same errors."""

from __future__ import annotations

import msgpack
import pytest
from codec_samples import REGISTRY, Base, Everything, Leaf, Tree, messages, sample
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.net.codec import DecodeError, EncodeError, Registry

ENCODE = REGISTRY.encoder()
DECODE = REGISTRY.decoder()


@settings(deadline=None)
@given(messages)
def test_encoder_and_decoder_equal_encode_and_decode(obj: object) -> None:
    data = ENCODE(obj)
    assert data == REGISTRY.encode(obj)
    assert DECODE(data) == REGISTRY.decode(data) == obj


@settings(deadline=None)
@given(st.binary(max_size=64))
def test_decoder_fails_exactly_as_decode_on_any_bytes(data: bytes) -> None:
    def outcome(decode: object) -> object:
        try:
            return decode(data)  # type: ignore[operator]
        except DecodeError as exc:
            return ("DecodeError", str(exc))

    slow = outcome(lambda d: REGISTRY.decode(d, expected=Base))
    assert outcome(REGISTRY.decoder(Base)) == slow


def test_decoder_checks_the_expected_class() -> None:
    data = REGISTRY.encode(Leaf(n=1))
    assert REGISTRY.decoder(Leaf)(data) == Leaf(n=1)
    with pytest.raises(DecodeError, match="expected Tree, got Leaf"):
        REGISTRY.decoder(Tree)(data)
    with pytest.raises(TypeError, match="expected must be a class"):
        REGISTRY.decoder("Leaf")  # type: ignore[arg-type]


def test_decoder_takes_other_bytes_likes_and_refuses_the_rest() -> None:
    data = REGISTRY.encode(sample())
    assert DECODE(bytearray(data)) == sample()  # type: ignore[arg-type]
    assert DECODE(memoryview(data)) == sample()  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decode takes bytes"):
        DECODE(7)  # type: ignore[arg-type]


def test_encoder_raises_the_precise_errors() -> None:
    with pytest.raises(EncodeError, match="not a registered message class"):
        ENCODE(object())
    bad = Everything.__new__(Everything)
    for f in Everything.__slots__:
        object.__setattr__(bad, f, getattr(sample(), f))
    object.__setattr__(bad, "n", 2**64)
    with pytest.raises(EncodeError, match=r"Everything\.n"):
        ENCODE(bad)
    # The encoder is still usable after an error (its packer starts afresh).
    assert ENCODE(sample()) == REGISTRY.encode(sample())


def test_size_limits_hold_both_ways() -> None:
    small = Registry(max_size=16)
    small.register(1, Leaf)
    with pytest.raises(EncodeError, match="over max_size=16"):
        small.encoder()(Leaf(n=1, s="x" * 40))
    frame = msgpack.packb([1, 1, "x" * 40], use_bin_type=True)
    with pytest.raises(DecodeError, match="exceeds max_size=16"):
        small.decoder()(frame)
    assert small.decoder()(small.encoder()(Leaf(n=3))) == Leaf(n=3)


def test_encoder_sees_classes_registered_later() -> None:
    registry = Registry()
    encode = registry.encoder()
    with pytest.raises(EncodeError):
        encode(Leaf(n=1))
    registry.register(1, Leaf)
    assert encode(Leaf(n=1)) == registry.encode(Leaf(n=1))
