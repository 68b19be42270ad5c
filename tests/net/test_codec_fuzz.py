"""Fuzzing the decoder: random bytes, random msgpack values and mutations of valid encodings
either decode to a valid object or raise DecodeError, never anything else."""

from __future__ import annotations

import random

import msgpack
from codec_samples import REGISTRY, SAMPLE_TYPES, messages, sample
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.net.codec import DecodeError

SWEEP = 3000


def check(data: bytes) -> object | None:
    """Decode `data`; on success the result must be a valid, re-encodable, stable object."""
    try:
        obj = REGISTRY.decode(data)
    except DecodeError as exc:
        if not str(exc):
            raise AssertionError("a DecodeError without a message") from exc
        return None
    again = REGISTRY.encode(obj)  # whatever decodes is encodable again ...
    assert REGISTRY.decode(again) == obj  # ... and round-trips
    assert type(obj) in SAMPLE_TYPES.values()
    return obj


@settings(deadline=None)  # CI shares 2 cores: no per-example timing
@given(st.binary(max_size=256))
def test_random_bytes(data: bytes) -> None:
    check(data)


type_ids = st.sampled_from(sorted(SAMPLE_TYPES)) | st.integers(-2, 20)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | type_ids
)
msgpack_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(type_ids, inner, inner)
        | st.tuples(type_ids, inner)
        | st.lists(inner, max_size=3).flatmap(lambda xs: type_ids.map(lambda t: [t, *xs]))
        | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=20,
)


@settings(deadline=None)  # CI shares 2 cores: no per-example timing
@given(type_ids, st.lists(msgpack_values, max_size=22))
def test_random_msgpack_arrays(type_id: int, fields: list[object]) -> None:
    """Well-formed msgpack of the right outer shape reaches the typed field checks."""
    check(msgpack.packb([type_id, *fields], use_bin_type=True))


def mutate(data: bytes, other: bytes, rnd: random.Random) -> bytes:
    buf = bytearray(data)
    op = rnd.randrange(7)
    if op == 0 and buf:  # flip one bit
        i = rnd.randrange(len(buf))
        buf[i] ^= 1 << rnd.randrange(8)
    elif op == 1:  # truncate
        del buf[rnd.randrange(len(buf) + 1) :]
    elif op == 2:  # splice: a prefix of one encoding with a suffix of another
        buf = buf[: rnd.randrange(len(buf) + 1)] + other[rnd.randrange(len(other) + 1) :]
    elif op == 3:  # insert a random byte
        buf.insert(rnd.randrange(len(buf) + 1), rnd.randrange(256))
    elif op == 4 and buf:  # delete a byte
        del buf[rnd.randrange(len(buf))]
    elif op == 5 and buf:  # overwrite a byte
        buf[rnd.randrange(len(buf))] = rnd.randrange(256)
    else:  # append garbage
        buf += rnd.randbytes(rnd.randrange(1, 4))
    return bytes(buf)


@settings(max_examples=150, deadline=None)
@given(messages, messages, st.integers(min_value=0, max_value=2**32))
def test_mutations_of_valid_encodings(a: object, b: object, seed: int) -> None:
    rnd = random.Random(seed)
    data, other = REGISTRY.encode(a), REGISTRY.encode(b)
    for _ in range(20):
        # Half the time mutate the previous mutant, so mutations also compound.
        data = mutate(data if rnd.random() < 0.5 else REGISTRY.encode(a), other, rnd)
        check(data)


def test_mutation_sweep_finds_both_outcomes() -> None:
    """A seeded sweep of mutations: both outcomes occur, so the fuzzer is not vacuous."""
    rnd = random.Random(1234)
    data = REGISTRY.encode(sample())
    other = REGISTRY.encode(sample().leaf)
    outcomes = [check(mutate(data, other, rnd)) is None for _ in range(SWEEP)]
    assert 0 < sum(outcomes) < len(outcomes)
